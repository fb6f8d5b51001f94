"""A port's connections, bounded in number and in time: whoever reaches the port could
otherwise keep a thread and a file descriptor of the process for good with each connection
that sends nothing.

Each connection is served by a thread of its own (the operator's waits at the gateway's /idle
block one), so the number of connections is the number of threads. Every legitimate caller
(Prometheus, the operator, the kubelet) sends its request at once and reads its answer at
once; a connection that has not sent its request line and headers within HEAD_TIMEOUT, or
lasts longer than its port's lifetime in all, is closed. When MOST_CONNECTIONS are open, a
new one takes the place of the one that has waited longest for its request (an idle or
trickling client), so that such clients cannot lock the scraper, the operator or the kubelet
out; it is refused only when every open connection is being answered.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

MOST_CONNECTIONS = 64
HEAD_TIMEOUT = 5.0
"""Seconds from accepting a connection to its whole request line and headers."""
IO_TIMEOUT = 5.0
"""Seconds any one read or write may block: a client that stops reading its answer."""
ROOM_TIMEOUT = 0.5
"""Seconds a new connection may wait for the thread of the one closed to make room to end."""


@dataclass
class _Open:
    accepted: float
    deadline: float
    answering: bool = False
    closing: bool = False


class Connections:
    """The open connections of one server, with their deadlines; each is listed from its
    admission until its thread ends, so that there are never more than `most` threads.
    Thread-safe: connections are admitted and reaped by the server's thread, marked and
    released by their own. A socket is shut down only while it is listed, and is unlisted
    before it is closed, so that a shutdown never reaches a file descriptor the system has
    since given to another connection."""

    def __init__(
        self,
        *,
        lifetime: float,
        most: int = MOST_CONNECTIONS,
        head_timeout: float = HEAD_TIMEOUT,
        room_timeout: float = ROOM_TIMEOUT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.most = most
        self.head_timeout = head_timeout
        self.lifetime = lifetime
        self.room_timeout = room_timeout
        self._clock = clock
        self._changed = threading.Condition()
        self._open: dict[socket.socket, _Open] = {}
        self.closed_early = 0
        """Connections closed for their deadline or to make room, and refused ones."""

    def __len__(self) -> int:
        with self._changed:
            return len(self._open)

    def admit(self, sock: socket.socket) -> bool:
        """List a new connection, once there is room: when full, the connection that has
        waited longest for its request is closed, and its thread awaited. False (refuse it)
        when no room comes within `room_timeout`: every open one is being answered."""
        with self._changed:
            if len(self._open) >= self.most:
                waiting = [
                    (o.accepted, s) for s, o in self._open.items() if not (o.answering or o.closing)
                ]
                if waiting:
                    self._close(min(waiting, key=lambda pair: pair[0])[1])
                if not self._changed.wait_for(
                    lambda: len(self._open) < self.most, self.room_timeout
                ):
                    self.closed_early += 1
                    return False
            now = self._clock()
            self._open[sock] = _Open(accepted=now, deadline=now + self.head_timeout)
            return True

    def answering(self, sock: socket.socket) -> None:
        """Its request's head is in: from now on only its lifetime bounds it."""
        with self._changed:
            entry = self._open.get(sock)
            if entry is not None:
                entry.answering = True
                entry.deadline = entry.accepted + self.lifetime

    def release(self, sock: socket.socket) -> None:
        """Unlist it as its thread ends (before it is closed)."""
        with self._changed:
            if self._open.pop(sock, None) is not None:
                self._changed.notify_all()

    def reap(self) -> None:
        """Close the connections past their deadline."""
        now = self._clock()
        with self._changed:
            for sock, entry in self._open.items():
                if entry.deadline <= now and not entry.closing:
                    self._close(sock)

    def _close(self, sock: socket.socket) -> None:
        """With the lock held: end the connection; its thread's blocked read or write
        returns, and the thread ends and releases it."""
        self._open[sock].closing = True
        self.closed_early += 1
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
