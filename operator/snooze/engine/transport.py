"""An httpx transport that queues requests in O(1) before httpcore's connection pool."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import httpx

DEADLINE = "snooze.deadline"
"""The request extension that carries a whole-answer deadline, in seconds from the slot."""


class BoundedTransport(httpx.AsyncBaseTransport):
    """At most `limit` requests inside httpcore's pool at once; the others wait here.

    httpcore matches every queued request against every pooled connection each time a request
    is queued or a connection released: O(queued x connections) per step. A thousand models
    probed together (or writing their status together) queue thousands of requests, and that
    matching took a whole core. An asyncio.Semaphore queues in O(1). A slot is held until the
    response body is closed.
    """

    def __init__(
        self,
        inner: httpx.AsyncBaseTransport,
        limit: int = 0,
        *,
        slots: asyncio.Semaphore | None = None,
    ) -> None:
        self._inner = inner
        # Several clients may share one set of slots: one bound for the whole process.
        self._slots = slots if slots is not None else asyncio.Semaphore(limit)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        await self._slots.acquire()
        # A request's whole-answer deadline (`extensions={DEADLINE: seconds}`) starts here,
        # once it holds a slot: the time it queued is this process's, not the server's.
        seconds = request.extensions.get(DEADLINE)
        deadline = None if seconds is None else asyncio.get_running_loop().time() + seconds
        try:
            async with asyncio.timeout_at(deadline):
                response = await self._inner.handle_async_request(request)
        except BaseException:
            self._slots.release()
            raise
        if isinstance(response.stream, httpx.AsyncByteStream):
            response.stream = _ReleasingStream(response.stream, self._slots.release, deadline)
        else:  # a body already in memory holds no connection
            self._slots.release()
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


class _ReleasingStream(httpx.AsyncByteStream):
    """A response body that gives its transport slot back once, when closed."""

    def __init__(
        self,
        inner: httpx.AsyncByteStream,
        release: Callable[[], None],
        deadline: float | None = None,
    ) -> None:
        self._inner = inner
        self._release: Callable[[], None] | None = release
        self._deadline = deadline

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._deadline is None:  # a watch stream, or a request without a deadline
            async for chunk in self._inner:
                yield chunk
            return
        chunks = aiter(self._inner)
        while True:
            async with asyncio.timeout_at(self._deadline):
                part = await anext(chunks, None)
            if part is None:
                return
            yield part

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            if self._release is not None:
                self._release()
                self._release = None
