"""One request to an engine as a check makes it: through the engine client's bounded HTTP
(engine/http.py), its answer kept whole or, when there was none, why; never an exception, so
that a hostile engine (one that never answers, drips, or sends a page without end) becomes a
failure line, not a hang or a traceback."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from snooze.engine.errors import EngineError
from snooze.engine.http import ANSWER_LIMIT, EngineHttp, Params


@dataclass(frozen=True)
class Asked:
    """An engine's answer to one request, or why there was none."""

    status: int | None = None
    """The HTTP status; None when nothing (whole) came back."""
    body: bytes = b""
    failure: str = ""
    """Why there is no answer: unreachable, timed out, or longer than what is read."""
    seconds: float = 0.0
    """How long it took, answered or not."""

    @property
    def answered(self) -> bool:
        return self.status is not None

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


async def ask(
    http: EngineHttp,
    method: str,
    url: str,
    *,
    timeout: float,  # noqa: ASYNC109 (counted from the request's turn, as EngineHttp does)
    limit: int = ANSWER_LIMIT,
    params: Params = None,
    json: Any = None,
) -> Asked:
    """Send one request; its whole answer (at most `limit` bytes, within `timeout` seconds), or
    why there is none."""
    started = time.monotonic()
    try:
        answer = await http.request(
            method,
            url,
            total=timeout,
            connect=min(timeout, 5.0),
            params=params,
            json=json,
            limit=limit,
        )
    except TimeoutError:
        return Asked(
            failure=f"no whole answer within {timeout:g}s", seconds=time.monotonic() - started
        )
    except EngineError as exc:
        return Asked(failure=str(exc), seconds=time.monotonic() - started)
    return Asked(status=answer.status, body=answer.body, seconds=time.monotonic() - started)


# -- reading answers, for any engine kind ------------------------------------------------------


def json_object(asked: Asked) -> dict[str, Any] | None:
    try:
        data = json.loads(asked.body)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def answer_said(asked: Asked) -> str:
    """An answer, shortened for a line: its status and the start of its body."""
    body = " ".join(asked.text.split())
    if len(body) > 120:
        body = body[:119] + "…"
    return f"{asked.status} {body!r}" if body else f"{asked.status} with an empty body"


def size(count: int) -> str:
    return f"{count} bytes" if count < 10_000 else f"{count / 1000:.0f} kB"


def unfiltered(page: str, names: Iterable[str]) -> bool:
    """A page that describes families not among `names`, which were asked for: the engine
    ignored name[]."""
    asked = {name.removesuffix("_total") for name in names}
    for line in page.splitlines():
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            name = line.split(" ", 3)[2] if line.count(" ") >= 2 else ""
            if name and name.removesuffix("_total") not in asked:
                return True
    return False
