"""An answer passed from an engine to a client under its deadlines: the engine's first chunk
within the first-byte timeout and each later one within the idle timeout; and the client,
while some of its answer waits for it, must take some within the client read timeout (a
client that reads nothing fills its connection's buffers, and its request would stay under
way, in flight to its engine, for as long as it kept the connection open).

A stream has hundreds of chunks; a timer for each would cost more than the copy. So reads
share one timer per answer: each read only notes when it began, and the timer, when it rings,
either finds the read under way late and cancels the task waiting on it, as asyncio.timeout
would, or sleeps until that read's deadline (never later than it: each read's deadline is at
least one full period after the timer was last set). The client is looked at on a timer of
its own, a few times per period.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeVar

import aiohttp
from aiohttp import web

from snooze.gateway.errors import REJECTED
from snooze.gateway.interruptible import Interruptible

FIRST_BYTE_FLAG = "--upstream-first-byte-timeout"
IDLE_FLAG = "--upstream-idle-timeout"
CLIENT_FLAG = "--client-read-timeout"
T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class Bounds:
    """How long an engine may keep a client waiting, and a client the engine's answer (the
    gateway's --upstream-* and --client-read-timeout flags)."""

    first_byte: float
    """From sending the request to the answer's head and first chunk."""
    idle: float
    """Between two chunks of the answer."""
    client_read: float
    """A write to the client, from its start to the client taking it."""


class UpstreamSilent(Exception):
    """The engine sent nothing for longer than a bound allows."""

    def __init__(self, seconds: float, flag: str) -> None:
        super().__init__(f"{seconds:g}s ({flag})")
        self.seconds = seconds
        self.flag = flag


class ClientStalled(Exception):
    """The client took nothing of its answer for longer than --client-read-timeout."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"the client read nothing for {seconds:g}s ({CLIENT_FLAG})")
        self.seconds = seconds


class _Timer:
    """One deadline at a time for one kind of operation, `period` after each one begins
    (`first`: a fixed deadline for the first one instead)."""

    def __init__(self, task: asyncio.Task[object], period: float, first: float | None):
        self.loop = asyncio.get_running_loop()
        self.task = task
        self.period = period
        self.until = first if first is not None else self.loop.time() + period
        self.fixed = first is not None
        """The deadline under way was given, not one period after its operation began."""
        self.busy = False
        self.late = False
        self.handle: asyncio.TimerHandle | None = None

    def begin(self) -> int:
        """An operation begins: the task's cancel count now, to tell its own cancel apart."""
        if self.fixed:
            self.fixed = False  # the given deadline, for this operation
        else:
            self.until = self.loop.time() + self.period
        if self.handle is None:
            self.handle = self.loop.call_at(self.until, self._ring)
        elif self.handle.when() > self.until:
            # Only after a given deadline later than one period (the first byte's).
            self.handle.cancel()
            self.handle = self.loop.call_at(self.until, self._ring)
        self.busy = True
        return self.task.cancelling()

    def end(self, cancelling: int, cancelled: bool) -> bool:
        """The operation is over (`cancelled`: by a CancelledError); True when that was the
        timer's, for being late (the task's cancel is then undone)."""
        self.busy = False
        if not (cancelled and self.late):
            return False
        self.late = False
        self.close()
        return self.task.uncancel() <= cancelling

    def _ring(self) -> None:
        now = self.loop.time()
        if self.busy and now >= self.until:
            self.handle = None
            self.late = True
            self.task.cancel()
            return
        self.handle = self.loop.call_at(self.until if self.busy else now + self.period, self._ring)

    def close(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
        self.handle = None


class Deadlines:
    """The deadlines of one answer, for the task that relays it. `first_byte` is when its
    first chunk is due (the request's head was sent under the same deadline)."""

    def __init__(self, bounds: Bounds, first_byte: float) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.bounds = bounds
        self.first = True
        self._reads = _Timer(task, bounds.idle, first_byte)

    async def read(self, upstream: aiohttp.ClientResponse) -> bytes:
        """The answer's next chunk (b"" at its end); UpstreamSilent when it is late."""
        if self.first:
            late = UpstreamSilent(self.bounds.first_byte, FIRST_BYTE_FLAG)
        else:
            late = UpstreamSilent(self.bounds.idle, IDLE_FLAG)
        chunk = await _timed(self._reads, upstream.content.readany(), late)
        self.first = False
        return chunk

    def close(self) -> None:
        self._reads.close()


# Linux's struct tcp_info (linux/tcp.h): the offsets of tcpi_unacked (segments sent and not
# acknowledged, u32), tcpi_bytes_acked (u64, Linux 4.1+) and tcpi_notsent_bytes (u32, 4.6+).
TCP_INFO = getattr(socket, "TCP_INFO", None)
TCP_INFO_BYTES = 148
UNACKED_AT, ACKED_AT, NOT_SENT_AT = 24, 120, 144


class ClientWatch(Interruptible):
    """The client of one answer, while the answer is passed on (an async context manager): it
    is stalled once some of its answer has waited for it (in the gateway's buffer, or in its
    connection's, sent or not) while it took none for `seconds`; the task is then cancelled,
    and leaves with ClientStalled. It takes some when its system acknowledges bytes (TCP's own
    count, read from Linux's TCP_INFO: a client that reads nothing has a full buffer, and
    acknowledges nothing more), or, where that cannot be read, when the gateway's buffer for
    it shrinks. Looked at every quarter of `seconds`."""

    def __init__(self, transport: asyncio.BaseTransport | None, seconds: float) -> None:
        self.transport = transport
        self.seconds = seconds
        self.loop = asyncio.get_running_loop()
        self.moved = 0.0
        """When the client last took something, or had nothing waiting for it."""
        self._acked: int | None = None
        self._buffered = 0
        self._handle: asyncio.TimerHandle | None = None

    def _enter(self) -> None:
        self.moved = self.loop.time()
        self._acked, self._buffered = self._counts()[:2]
        self._handle = self.loop.call_later(self.seconds / 4, self._look)

    def _leave(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _error(self) -> Exception:
        return ClientStalled(self.seconds)

    def _look(self) -> None:
        now = self.loop.time()
        acked, buffered, waiting = self._counts()
        took = (acked is not None and acked != self._acked) or (
            acked is None and buffered < self._buffered
        )
        if took or not waiting:
            self.moved = now
        self._acked, self._buffered = acked, buffered
        if now - self.moved >= self.seconds:
            self._handle = None
            self.interrupt()
            return
        self._handle = self.loop.call_later(self.seconds / 4, self._look)

    def _counts(self) -> tuple[int | None, int, bool]:
        """The bytes the client has acknowledged (None where they cannot be read), the
        gateway's buffer for it, and whether anything waits for it at all."""
        transport = self.transport
        if not isinstance(transport, asyncio.WriteTransport) or transport.is_closing():
            return None, 0, False
        buffered = transport.get_write_buffer_size()
        sock = transport.get_extra_info("socket")
        if TCP_INFO is None or sock is None:
            return None, buffered, buffered > 0
        try:
            info = sock.getsockopt(socket.IPPROTO_TCP, TCP_INFO, TCP_INFO_BYTES)
        except OSError:
            return None, buffered, buffered > 0
        if len(info) < TCP_INFO_BYTES:
            return None, buffered, buffered > 0
        (unacked,) = struct.unpack_from("I", info, UNACKED_AT)
        (acked,) = struct.unpack_from("Q", info, ACKED_AT)
        (not_sent,) = struct.unpack_from("I", info, NOT_SENT_AT)
        return acked, buffered, bool(buffered or unacked or not_sent)


async def _timed(timer: _Timer, operation: Awaitable[T], late: Exception) -> T:
    """`operation`, under `timer`'s deadline: `late` when past it."""
    cancelling = timer.begin()
    try:
        result = await operation
    except asyncio.CancelledError:
        if timer.end(cancelling, cancelled=True):
            raise late from None
        raise
    except BaseException:
        timer.end(cancelling, cancelled=False)
        raise
    timer.end(cancelling, cancelled=False)
    return result


async def bounded_write(
    response: web.StreamResponse, data: bytes, seconds: float, *, eof: bool = False
) -> None:
    """One write to a client outside a relayed answer (an SSE comment or error event), within
    `seconds`; ClientStalled past them."""
    try:
        async with asyncio.timeout(seconds):
            await response.write(data)
            if eof:
                await response.write_eof()
    except TimeoutError:
        raise ClientStalled(seconds) from None


def abandon(request: web.Request, response: web.StreamResponse) -> web.StreamResponse:
    """A client that takes nothing of its answer: its connection is closed at once, what is
    buffered for it dropped (it would never drain, and a graceful close waits for it), so that
    its request ends (and with it the engine's, and its count as in flight)."""
    transport = request.transport
    if transport is not None:
        transport.abort()
    response[REJECTED] = "client_stalled"
    return response
