"""Forwards one request to an engine and passes the answer back as it arrives, unbuffered."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from snooze.gateway.errors import error_response, sse_error

log = logging.getLogger(__name__)

# RFC 9110 hop-by-hop headers belong to one connection, never forwarded; Host and
# Content-Length are recomputed for the new connection and body.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
# Errors after the request may have reached the engine: never retried (not idempotent).
UPSTREAM_BROKE = (aiohttp.ClientError, ConnectionError, TimeoutError)


class ConnectFailed(Exception):
    """The engine could not be reached at all: the request was not sent, another pod may try."""


def forward_headers(headers: Mapping[str, str]) -> CIMultiDict[str]:
    named = {v.strip().lower() for v in headers.get("Connection", "").split(",") if v.strip()}
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        lowered = name.lower()
        if lowered not in HOP_BY_HOP and lowered not in named:
            out.add(name, value)
    return out


async def forward(
    session: aiohttp.ClientSession,
    request: web.Request,
    *,
    url: URL,
    body: bytes,
    started: web.StreamResponse | None,
    extra_headers: Mapping[str, str],
    pod_name: str,
) -> web.StreamResponse:
    """Send `body` to `url`; stream the answer into `started` (an SSE already begun) or a new one.

    Raises ConnectFailed only when nothing was sent; every later failure becomes a 502 (or an
    SSE error event when the stream has begun).
    """
    headers = forward_headers(request.headers)
    if request.remote:
        headers.add("X-Forwarded-For", request.remote)
    try:
        upstream = await session.request(request.method, url, data=body, headers=headers)
    except aiohttp.ClientConnectorError as exc:
        raise ConnectFailed(f"pod {pod_name}: {exc}") from exc
    except UPSTREAM_BROKE as exc:
        return await _broken(started, request, pod_name, exc)
    async with upstream:
        event_stream = upstream.content_type == "text/event-stream"
        if started is not None and (upstream.status >= 300 or not event_stream):
            # The client already has a 200 SSE head: the engine's refusal becomes an event.
            text = (await upstream.read()).decode(errors="replace")[:2000]
            await started.write(sse_error(upstream.status, f"pod {pod_name} answered: {text}"))
            await started.write_eof()
            return started
        if started is None and not event_stream:
            try:
                payload = await upstream.read()
            except UPSTREAM_BROKE as exc:
                return await _broken(None, request, pod_name, exc)
            whole = web.Response(status=upstream.status, body=payload)
            _copy_headers(upstream, whole, extra_headers)
            return whole
        response = started
        if response is None:
            response = web.StreamResponse(status=upstream.status)
            _copy_headers(upstream, response, extra_headers)
            await response.prepare(request)
        try:
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
        except UPSTREAM_BROKE as exc:
            if request.transport is None or request.transport.is_closing():
                raise  # the client left: nothing to tell it
            return await _broken(response, request, pod_name, exc)
        await response.write_eof()
        return response


def _copy_headers(
    upstream: aiohttp.ClientResponse, response: web.StreamResponse, extra: Mapping[str, str]
) -> None:
    for name, value in forward_headers(upstream.headers).items():
        if name.lower() not in ("date", "server"):
            response.headers.add(name, value)
    response.headers.update(extra)


async def _broken(
    started: web.StreamResponse | None, request: web.Request, pod_name: str, exc: BaseException
) -> web.StreamResponse:
    message = (
        f"the engine in pod {pod_name} failed while answering ({type(exc).__name__}: {exc}); "
        "the request may be retried"
    )
    log.warning("%s %s: %s", request.method, request.path, message)
    if started is None:
        return error_response(502, message, code="upstream_failed")
    if not started.prepared:
        await started.prepare(request)
    await started.write(sse_error(502, message, code="upstream_failed"))
    await started.write_eof()
    return started
