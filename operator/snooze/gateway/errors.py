"""Errors in OpenAI's shape, as JSON responses and as SSE events for streams already started."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

# OpenAI's `type` for each status the gateway answers itself.
TYPES = {
    400: "invalid_request_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    431: "invalid_request_error",
    429: "rate_limit_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout_error",
}


# Why the gateway refused a request, for `snooze_gateway_rejected_requests_total{reason}`.
REASONS = {
    400: "bad_request",
    404: "unknown_model",
    408: "bad_request",
    413: "too_large",
    415: "bad_request",
    431: "too_large",
    429: "limit",
    502: "upstream_error",
    503: "unavailable",
    504: "timeout",
}
REJECTED = web.ResponseKey("snooze_rejected", str)
"""The key, on a response the gateway made itself, of its rejection reason."""


def error_body(
    status: int, message: str, *, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    kind = TYPES.get(status, "api_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(
    status: int,
    message: str,
    *,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
    reason: str | None = None,
) -> web.Response:
    """An error the gateway answers itself; `reason` (for the rejection metric) defaults to
    the one of its status."""
    response = web.json_response(
        error_body(status, message, param=param, code=code), status=status, headers=headers
    )
    response[REJECTED] = reason or REASONS.get(status, "upstream_error")
    return response


def sse_error(status: int, message: str, *, code: str | None = None) -> bytes:
    """An error event that ends a stream; OpenAI's clients raise on a `data` with `error`."""
    return b"data: " + json.dumps(error_body(status, message, code=code)).encode() + b"\n\n"
