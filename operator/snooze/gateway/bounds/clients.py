"""The clients of answers under way: one that takes none of its answer for
--client-read-timeout while some of it waits for it is cut, so that its request ends (and
with it the engine's, and its count as in flight, by which the operator knows its model
busy). A slow reader is never cut; one that reads nothing is, however large the buffers
between (the kernel's send buffer holds megabytes on loopback)."""

from __future__ import annotations

import asyncio
import socket
import struct

from aiohttp import web

from snooze.gateway.bounds.interruptible import Interruptible
from snooze.gateway.errors import REJECTED

CLIENT_FLAG = "--client-read-timeout"


class ClientStalled(Exception):
    """The client took nothing of its answer for longer than --client-read-timeout."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"the client read nothing for {seconds:g}s ({CLIENT_FLAG})")
        self.seconds = seconds


# Linux's struct tcp_info (linux/tcp.h): the offsets of tcpi_unacked (segments sent and not
# acknowledged, u32), tcpi_bytes_acked (u64, Linux 4.1+) and tcpi_notsent_bytes (u32, 4.6+).
TCP_INFO = getattr(socket, "TCP_INFO", None)
TCP_INFO_BYTES = 148
UNACKED_AT, ACKED_AT, NOT_SENT_AT = 24, 120, 144


class ClientWatches:
    """The clients of the answers under way, looked at together every quarter of `seconds` by
    one timer (an answer costs no timer of its own): a client is cut between one and one and
    a half periods after it last took anything."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._watched: set[ClientWatch] = set()
        self._timer: asyncio.TimerHandle | None = None

    def watch(self, transport: asyncio.BaseTransport | None) -> ClientWatch:
        """The watch of the client on `transport`, for the time its answer is passed on."""
        return ClientWatch(self, transport)

    def _add(self, watch: ClientWatch) -> None:
        self._watched.add(watch)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.seconds / 4, self._look)

    def _look(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        for watch in list(self._watched):
            watch.look(now)
        self._timer = loop.call_later(self.seconds / 4, self._look) if self._watched else None


class ClientWatch(Interruptible):
    """The client of one answer, while the answer is passed on (an async context manager): it
    is stalled once some of its answer has waited for it (in the gateway's buffer, or in its
    connection's, sent or not) while it took none for a period; the task is then cancelled,
    and leaves with ClientStalled. It takes some when its system acknowledges bytes (TCP's own
    count, read from Linux's TCP_INFO: a client that reads nothing has a full buffer, and
    acknowledges nothing more), or, where that cannot be read, when the gateway's buffer for
    it shrinks."""

    def __init__(self, watches: ClientWatches, transport: asyncio.BaseTransport | None) -> None:
        self.watches = watches
        self.transport = transport
        self.moved = 0.0
        """When the client last took something, or had nothing waiting for it."""
        self._looked = False
        self._acked: int | None = None
        self._buffered = 0

    def _enter(self) -> None:
        self.watches._add(self)

    def _leave(self) -> None:
        self.watches._watched.discard(self)

    def _error(self) -> Exception:
        return ClientStalled(self.watches.seconds)

    def look(self, now: float) -> None:
        """Whether the client took anything since the last look (the first look only counts)."""
        acked, buffered, waiting = self._counts()
        took = not self._looked or (
            acked != self._acked if acked is not None else buffered < self._buffered
        )
        self._looked = True
        if took or not waiting:
            self.moved = now
        self._acked, self._buffered = acked, buffered
        if now - self.moved >= self.watches.seconds:
            self.watches._watched.discard(self)
            self.interrupt()

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
