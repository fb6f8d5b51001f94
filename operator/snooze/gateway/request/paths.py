"""Which request paths the gateway forwards: an allowlist of inference routes, checked as sent.

An engine in sleep mode also serves admin routes (`/sleep`, `/wake_up`, `/collective_rpc`)
on the same port as inference. The gateway is the only way in for anonymous clients, so it
must never let a path reach those: it checks the request target exactly as it arrived
(before any library decodes percent-escapes or resolves `..`), refuses anything that could
mean another path than it reads as, and forwards only to a path taken from this list, never
to the client's own string.
"""

from __future__ import annotations

# vLLM's OpenAI-compatible routes whose JSON body names the `model`. Nothing else is forwarded.
INFERENCE_PATHS = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
    "/v1/rerank",
    "/v1/score",
)


def refusal(raw_target: str) -> str | None:
    """Pure: why a raw request target (path and query, as sent) is refused, or None.

    Refused: anything but an origin-form path; percent-escapes and backslashes in the path
    (an encoded `/` or `.` is a second spelling of another path); `.` and `..` segments;
    empty segments (`//`). No route the gateway serves needs any of them.
    """
    path = raw_target.split("?", 1)[0].split("#", 1)[0]
    if not path.startswith("/"):
        return "the request target must be a path beginning with '/'"
    if "%" in path or "\\" in path:
        return "percent-encoded characters and backslashes are not accepted in the path"
    segments = path.split("/")[1:]
    if any(segment in (".", "..") for segment in segments):
        return "'.' and '..' segments are not accepted in the path"
    if "" in segments[:-1]:
        return "empty segments ('//') are not accepted in the path"
    return None
