"""Bearer tokens, checked as an API server's token authenticator checks them.

Off by default: the sandbox answers anyone. Switched on (`Sandbox.accept_tokens`), requests
without an accepted token get 401, and the tokens clients sent are counted, so that a test
can prove which credentials reached the server and how a client reacts to a refusal.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Tokens:
    accepted: frozenset[str] | None = None
    """The tokens let in; None: every request, with or without one."""
    seen: collections.Counter[str] = field(default_factory=collections.Counter)
    """Requests per token sent ("" for none)."""
    _guard: threading.Lock = field(default_factory=threading.Lock)

    def admit(self, authorization: str | None) -> bool:
        """Count the request's token; whether it may pass."""
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip() if scheme.lower() == "bearer" else ""
        with self._guard:
            self.seen[token] += 1
            return self.accepted is None or token in self.accepted

    def accept(self, tokens: frozenset[str] | None) -> None:
        with self._guard:
            self.accepted = tokens

    def counts(self) -> dict[str, int]:
        with self._guard:
            return dict(self.seen)


# Reviews a client creates to ask "may I (or may this user) do this?": never stored, answered.
ACCESS_REVIEWS = frozenset(
    {
        "selfsubjectaccessreviews",
        "subjectaccessreviews",
        "localsubjectaccessreviews",
    }
)


def access_review(body: dict[str, Any]) -> dict[str, Any]:
    """The API server's answer to an access review when its authorizer allows everything (the
    sandbox has no RBAC: kube-apiserver --authorization-mode=AlwaysAllow answers so): the
    review with its status filled in; impersonation headers change nothing, as everyone may
    impersonate anyone."""
    return {
        **body,
        "metadata": {**(body.get("metadata") or {}), "creationTimestamp": None},
        "status": {"allowed": True, "reason": "the sandbox authorizes every request (no RBAC)"},
    }
