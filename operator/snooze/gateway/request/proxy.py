"""Forwards one request to an engine, and passes its answer on to the client as it comes,
streamed or not: nothing of it is held but the chunk in hand, so the gateway's memory does
not grow with an answer, however long (one of 300 MB took a gateway from 70 to 946 MiB when
answers that come whole were read whole first). What is held is bounded: a refusal that
meets a stream already begun keeps its first ERROR_TEXT_BYTES, for the error event that
tells it.

The first chunk is read before anything is sent, so that an engine silent until then still
gets a clean 504 in OpenAI's shape. After that, a stream that fails ends with an SSE error
event; an answer that comes whole and fails midway is cut (its client sees a body shorter
than announced, or an unfinished chunked one, and raises), since nothing can be appended to
JSON already sent.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from snooze.gateway.bounds.clients import ClientStalled, ClientWatches, abandon, bounded_write
from snooze.gateway.bounds.deadlines import FIRST_BYTE_FLAG, Bounds, Deadlines, UpstreamSilent
from snooze.gateway.bounds.stalls import EngineStuck, Waiting
from snooze.gateway.errors import REJECTED, error_response, sse_error
from snooze.gateway.request.headers import forward_headers, forwarded_for

log = logging.getLogger(__name__)

# Errors after the request may have reached the engine: never retried (not idempotent).
UPSTREAM_BROKE = (aiohttp.ClientError, ConnectionError)
# Errors before anything was sent: another pod may be tried.
NOT_SENT = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)
ERROR_TEXT_BYTES = 8192
"""What is read of an engine's refusal of a stream already begun: its error event quotes
2,000 characters of it (8 KiB of UTF-8 at most)."""
EVENT_START = b"data:"


class ConnectFailed(Exception):
    """The engine could not be reached at all: the request was not sent, another pod may try."""


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
    watch: Waiting,
    clients: ClientWatches,
) -> web.StreamResponse:
    """Send `body` to `url`; pass the answer on into `started` (an SSE already begun) or a new
    response, as it comes.

    Raises ConnectFailed only when nothing was sent; every later failure becomes a 502, a
    silent engine a 504 (or an SSE error event when the stream has begun; an answer that comes
    whole and breaks after its first bytes went out is cut, and its client sees it cut).
    """
    headers = forward_headers(request.headers)
    headers.popall("Content-Encoding", None)  # the body was decoded (body.py)
    forwarded_for(headers, request.remote)
    relay = Relay(request, started, extra_headers, pod_name, bounds, clients)
    try:
        async with watch:
            return await relay.run(session, url, body, headers, watch)
    except EngineStuck as exc:
        message = (
            f"the engine in pod {pod_name} is taken as stuck: {exc}; it gets no request for "
            f"{exc.avoid:g}s; retry"
        )
        return await relay.fail(502, message, "upstream_stalled", "upstream_stalled")
    except ClientStalled as exc:
        return relay.cut(exc)


class Relay:
    """The passage of one answer: where it has got to, and how it ends when it fails."""

    def __init__(
        self,
        request: web.Request,
        started: web.StreamResponse | None,
        extra_headers: Mapping[str, str],
        pod_name: str,
        bounds: Bounds,
        clients: ClientWatches,
    ) -> None:
        self.request = request
        self.started = started
        """The SSE begun while the request was held, if it was."""
        self.response = started
        """What the client has been sent the head of, if anything."""
        self.event_stream = started is not None
        self.extra = extra_headers
        self.pod_name = pod_name
        self.bounds = bounds
        self.clients = clients

    async def run(
        self,
        session: aiohttp.ClientSession,
        url: URL,
        body: bytes,
        headers: CIMultiDict[str],
        watch: Waiting,
    ) -> web.StreamResponse:
        first_byte = asyncio.get_running_loop().time() + self.bounds.first_byte
        try:
            async with asyncio.timeout_at(first_byte):
                upstream = await session.request(
                    self.request.method, url, data=body, headers=headers
                )
        except NOT_SENT as exc:
            raise ConnectFailed(f"pod {self.pod_name}: {exc}") from exc
        except TimeoutError:
            return await self.silent(UpstreamSilent(self.bounds.first_byte, FIRST_BYTE_FLAG))
        except UPSTREAM_BROKE as exc:
            return await self.broken(exc)
        deadlines = Deadlines(self.bounds, first_byte)
        try:
            async with upstream:
                return await self._relay(upstream, deadlines, watch)
        finally:
            deadlines.close()

    async def _relay(
        self, upstream: aiohttp.ClientResponse, deadlines: Deadlines, watch: Waiting
    ) -> web.StreamResponse:
        """The engine's answer, its head received, passed on to the client."""
        event_stream = upstream.content_type == "text/event-stream"
        ok = upstream.status < 300
        if not ok:
            watch.started()  # an error: the request waits for nothing more
        if self.started is not None and (not ok or not event_stream):
            # The client already has a 200 SSE head: the engine's refusal becomes an event.
            return await self._refused(upstream, deadlines)
        try:
            chunk = await deadlines.read(upstream)
        except UpstreamSilent as exc:
            return await self.silent(exc)
        except UPSTREAM_BROKE as exc:
            return await self.broken(exc)
        response = self.response
        if response is None:
            response = web.StreamResponse(status=upstream.status)
            self._copy_headers(upstream, response)
            if not event_stream and upstream.content_length is not None:
                response.content_length = upstream.content_length
            await response.prepare(self.request)
            self.response, self.event_stream = response, event_stream
        try:
            async with self.clients.watch(self.request.transport):
                while chunk:
                    # Anything of a successful answer shows the engine works; of a stream,
                    # an event, not a comment (vLLM sends comments while idle when asked to).
                    if ok and (not event_stream or EVENT_START in chunk):
                        watch.progress()
                    await response.write(chunk)
                    chunk = await deadlines.read(upstream)
                await response.write_eof()
        except UpstreamSilent as exc:
            return await self.silent(exc)
        except UPSTREAM_BROKE as exc:
            if self.request.transport is None or self.request.transport.is_closing():
                raise  # the client left: nothing to tell it
            return await self.broken(exc)
        return response

    async def _refused(
        self, upstream: aiohttp.ClientResponse, deadlines: Deadlines
    ) -> web.StreamResponse:
        assert self.started is not None
        parts, size = [], 0
        try:
            while size < ERROR_TEXT_BYTES and (chunk := await deadlines.read(upstream)):
                parts.append(chunk)
                size += len(chunk)
            text = b"".join(parts)[:ERROR_TEXT_BYTES].decode(errors="replace")[:2000]
        except (UpstreamSilent, *UPSTREAM_BROKE) as exc:
            text = f"(its answer was cut: {exc})"
        event = sse_error(upstream.status, f"pod {self.pod_name} answered: {text}")
        await bounded_write(self.started, event, self.bounds.client_read, eof=True)
        return self.started

    def _copy_headers(self, upstream: aiohttp.ClientResponse, response: web.StreamResponse) -> None:
        for name, value in forward_headers(upstream.headers).items():
            if name.lower() not in ("date", "server"):
                response.headers.add(name, value)
        response.headers.update(self.extra)

    async def silent(self, exc: UpstreamSilent) -> web.StreamResponse:
        message = (
            f"the engine in pod {self.pod_name} did not answer within {exc} and was given up "
            "on; the request may have reached it, so it is not retried"
        )
        return await self.fail(504, message, "upstream_timeout", "upstream_timeout")

    async def broken(self, exc: BaseException) -> web.StreamResponse:
        message = (
            f"the engine in pod {self.pod_name} failed while answering ({type(exc).__name__}: "
            f"{exc}); the request may be retried"
        )
        return await self.fail(502, message, "upstream_failed", "upstream_error")

    async def fail(self, status: int, message: str, code: str, reason: str) -> web.StreamResponse:
        """The error as an answer, or as the final event of a stream already begun; an answer
        that comes whole, begun, is cut."""
        log.warning("%s %s: %s", self.request.method, self.request.path, message)
        response = self.response
        if response is None:
            return error_response(status, message, code=code, reason=reason)
        if not self.event_stream:
            # JSON already begun: cut, so that its client sees it unfinished.
            transport = self.request.transport
            if transport is not None:
                transport.abort()
            response[REJECTED] = reason
            return response
        try:
            await bounded_write(
                response, sse_error(status, message, code=code), self.bounds.client_read, eof=True
            )
        except ClientStalled as exc:
            return self.cut(exc)
        response[REJECTED] = reason
        return response

    def cut(self, exc: ClientStalled) -> web.StreamResponse:
        """A client that takes nothing of its answer (deadlines.abandon)."""
        log.info(
            "%s %s from %s: cut, %s", self.request.method, self.request.path, self.request.remote,
            exc,
        )  # fmt: skip
        response = self.response
        assert response is not None  # only a write to a client can stall
        return abandon(self.request, response)
