"""The API server's wire conventions: URL layout, Status error bodies, names and timestamps."""

from __future__ import annotations

import datetime
import random
import re
from dataclasses import dataclass
from typing import Any

# The reason that the API server puts into a Status for each HTTP code (metav1.StatusReason).
REASONS: dict[int, str] = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


class ApiError(Exception):
    """An API failure that is answered with a `Status` body, as the API server does."""

    def __init__(
        self,
        code: int,
        message: str,
        *,
        reason: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason or REASONS.get(code, "Unknown")
        self.details = details

    def status(self) -> dict[str, Any]:
        return status_body(self.code, self.message, reason=self.reason, details=self.details)


def status_body(
    code: int, message: str, *, reason: str | None = None, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A `Status` object with `status: Failure`, as the API server sends for errors; pure."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason or REASONS.get(code, "Unknown"),
        "code": code,
    }
    if details:
        body["details"] = details
    return body


@dataclass(frozen=True, kw_only=True)
class ApiPath:
    """A parsed resource URL: /api/v1/... or /apis/GROUP/VERSION/..., any part may be absent."""

    group: str
    version: str | None = None
    namespace: str | None = None
    plural: str | None = None
    name: str | None = None
    subresource: str | None = None
    legacy_watch: bool = False  # the deprecated /watch/ prefix, which kubectl still understands


def parse_api_path(path: str) -> ApiPath | None:
    """Parse a resource URL as the API server routes it; None for non-resource URLs; pure."""
    parts = path.strip("/").split("/")
    if parts[0] == "api" and len(parts) >= 2:
        group, version, rest = "", parts[1], parts[2:]
    elif parts[0] == "apis" and len(parts) == 2:
        return ApiPath(group=parts[1])
    elif parts[0] == "apis" and len(parts) >= 3:
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    legacy_watch = bool(rest) and rest[0] == "watch"
    rest = rest[1:] if legacy_watch else rest
    namespace: str | None = None
    # `namespaces/NAME/status` is the namespace's own subresource, not a resource in it.
    if (
        len(rest) >= 3
        and rest[0] == "namespaces"
        and not (len(rest) == 3 and rest[2] in ("status", "finalize"))
    ):
        namespace, rest = rest[1], rest[2:]
    return ApiPath(
        group=group,
        version=version,
        namespace=namespace,
        plural=rest[0] if rest else None,
        name=rest[1] if len(rest) > 1 else None,
        subresource="/".join(rest[2:]) or None,
        legacy_watch=legacy_watch,
    )


def now_rfc3339() -> str:
    """The current time as the API server writes timestamps (seconds, UTC, `Z`)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# The alphabet of the API server's generateName suffixes: no vowels, no confusable digits.
_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def generate_name(prefix: str) -> str:
    """A name from `generateName`: the prefix plus 5 random characters, as the API server does."""
    return prefix + "".join(random.choices(_SUFFIX_ALPHABET, k=5))


_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def name_problem(name: str) -> str | None:
    """Why a name is not a valid DNS subdomain (the rule for most resources), or None; pure."""
    if len(name) > 253:
        return "must be no more than 253 characters"
    if not _DNS_SUBDOMAIN.match(name):
        return (
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters,"
            " '-' or '.', and must start and end with an alphanumeric character"
        )
    return None
