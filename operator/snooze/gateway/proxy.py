"""Forwards one request to an engine and passes the answer back as it arrives, unbuffered."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from yarl import URL

from snooze.gateway.errors import REJECTED, error_response, sse_error
from snooze.gateway.headers import forward_headers, forwarded_for

log = logging.getLogger(__name__)

# Errors after the request may have reached the engine: never retried (not idempotent).
UPSTREAM_BROKE = (aiohttp.ClientError, ConnectionError)
# Errors before anything was sent: another pod may be tried.
NOT_SENT = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)


class ConnectFailed(Exception):
    """The engine could not be reached at all: the request was not sent, another pod may try."""


@dataclass(frozen=True, kw_only=True)
class Bounds:
    """How long an engine may keep a client waiting (the gateway's --upstream-* flags)."""

    first_byte: float
    """From sending the request to the answer's head and first chunk."""
    idle: float
    """Between two chunks of the answer."""


class _Chunks:
    """An answer's body chunk by chunk, each read bounded: the first by the first-byte
    deadline, the others by the idle timeout. Raises UpstreamSilent when one is late.

    One timer per answer, not one per chunk (a stream has hundreds): each read moves the
    deadline, and the timer, when it fires, either finds the deadline moved and sleeps
    until it, or cancels the read it bounds, as asyncio.timeout would."""

    def __init__(self, upstream: aiohttp.ClientResponse, bounds: Bounds, deadline: float):
        self.upstream = upstream
        self.bounds = bounds
        self.first = True
        self.loop = asyncio.get_running_loop()
        self.until = deadline
        """When the read under way is late."""
        self.reading = False
        self.late = False
        self.task: asyncio.Task[object] | None = None
        self.timer: asyncio.TimerHandle | None = None

    async def next(self) -> bytes:
        if self.timer is None:
            self.task = asyncio.current_task()
            self.timer = self.loop.call_at(self.until, self._ring)
        if not self.first:
            self.until = self.loop.time() + self.bounds.idle
        assert self.task is not None
        cancelling = self.task.cancelling()
        self.reading = True
        try:
            chunk = await self.upstream.content.readany()
        except asyncio.CancelledError:
            if self.late and self.task.uncancel() <= cancelling:
                self.close()
                if self.first:
                    raise UpstreamSilent(
                        self.bounds.first_byte, "--upstream-first-byte-timeout"
                    ) from None
                raise UpstreamSilent(self.bounds.idle, "--upstream-idle-timeout") from None
            raise
        finally:
            self.reading = False
        self.first = False
        return chunk

    def _ring(self) -> None:
        now = self.loop.time()
        if self.reading and now >= self.until and self.task is not None:
            self.timer = None
            self.late = True
            self.task.cancel()
            return
        # Not reading (writing to the client, which this bound does not cover): the next
        # read sets its own deadline, no earlier than a full idle period from now.
        self.timer = self.loop.call_at(
            self.until if self.reading else now + self.bounds.idle, self._ring
        )

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer = None


class UpstreamSilent(Exception):
    """The engine sent nothing for longer than a bound allows."""

    def __init__(self, seconds: float, flag: str) -> None:
        super().__init__(f"{seconds:g}s ({flag})")
        self.seconds = seconds
        self.flag = flag


async def forward(
    session: aiohttp.ClientSession,
    request: web.Request,
    *,
    url: URL,
    body: bytes,
    started: web.StreamResponse | None,
    extra_headers: Mapping[str, str],
    pod_name: str,
    bounds: Bounds,
) -> web.StreamResponse:
    """Send `body` to `url`; stream the answer into `started` (an SSE already begun) or a new one.

    Raises ConnectFailed only when nothing was sent; every later failure becomes a 502, a
    silent engine a 504 (or an SSE error event when the stream has begun).
    """
    headers = forward_headers(request.headers)
    headers.popall("Content-Encoding", None)  # the body was decoded (body.py)
    forwarded_for(headers, request.remote)
    deadline = asyncio.get_running_loop().time() + bounds.first_byte
    try:
        async with asyncio.timeout_at(deadline):
            upstream = await session.request(request.method, url, data=body, headers=headers)
    except NOT_SENT as exc:
        raise ConnectFailed(f"pod {pod_name}: {exc}") from exc
    except TimeoutError:
        return await _silent(
            started,
            request,
            pod_name,
            UpstreamSilent(bounds.first_byte, "--upstream-first-byte-timeout"),
        )
    except UPSTREAM_BROKE as exc:
        return await _broken(started, request, pod_name, exc)
    async with upstream:
        chunks = _Chunks(upstream, bounds, deadline)
        try:
            return await _relay(upstream, chunks, request, started, extra_headers, pod_name)
        finally:
            chunks.close()


async def _relay(
    upstream: aiohttp.ClientResponse,
    chunks: _Chunks,
    request: web.Request,
    started: web.StreamResponse | None,
    extra_headers: Mapping[str, str],
    pod_name: str,
) -> web.StreamResponse:
    """The engine's answer, its head received, passed on to the client."""
    event_stream = upstream.content_type == "text/event-stream"
    if started is not None and (upstream.status >= 300 or not event_stream):
        # The client already has a 200 SSE head: the engine's refusal becomes an event.
        try:
            text = (await _whole(chunks)).decode(errors="replace")[:2000]
        except (UpstreamSilent, *UPSTREAM_BROKE) as exc:
            text = f"(its answer was cut: {exc})"
        await started.write(sse_error(upstream.status, f"pod {pod_name} answered: {text}"))
        await started.write_eof()
        return started
    if started is None and not event_stream:
        try:
            payload = await _whole(chunks)
        except UpstreamSilent as exc:
            return await _silent(None, request, pod_name, exc)
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
        while chunk := await chunks.next():
            await response.write(chunk)
    except UpstreamSilent as exc:
        return await _silent(response, request, pod_name, exc)
    except UPSTREAM_BROKE as exc:
        if request.transport is None or request.transport.is_closing():
            raise  # the client left: nothing to tell it
        return await _broken(response, request, pod_name, exc)
    await response.write_eof()
    return response


async def _whole(chunks: _Chunks) -> bytes:
    parts = []
    while chunk := await chunks.next():
        parts.append(chunk)
    return b"".join(parts)


def _copy_headers(
    upstream: aiohttp.ClientResponse, response: web.StreamResponse, extra: Mapping[str, str]
) -> None:
    for name, value in forward_headers(upstream.headers).items():
        if name.lower() not in ("date", "server"):
            response.headers.add(name, value)
    response.headers.update(extra)


async def _silent(
    started: web.StreamResponse | None, request: web.Request, pod_name: str, exc: UpstreamSilent
) -> web.StreamResponse:
    message = (
        f"the engine in pod {pod_name} did not answer within {exc} and was given up on; "
        "the request may have reached it, so it is not retried"
    )
    log.warning("%s %s: %s", request.method, request.path, message)
    return await _end(started, request, 504, message, "upstream_timeout", "upstream_timeout")


async def _broken(
    started: web.StreamResponse | None, request: web.Request, pod_name: str, exc: BaseException
) -> web.StreamResponse:
    message = (
        f"the engine in pod {pod_name} failed while answering ({type(exc).__name__}: {exc}); "
        "the request may be retried"
    )
    log.warning("%s %s: %s", request.method, request.path, message)
    return await _end(started, request, 502, message, "upstream_failed", "upstream_error")


async def _end(
    started: web.StreamResponse | None,
    request: web.Request,
    status: int,
    message: str,
    code: str,
    reason: str,
) -> web.StreamResponse:
    """The error as an answer, or as the final event of a stream already begun."""
    if started is None:
        return error_response(status, message, code=code, reason=reason)
    if not started.prepared:
        await started.prepare(request)
    await started.write(sse_error(status, message, code=code))
    await started.write_eof()
    started[REJECTED] = reason
    return started
