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
out; it is refused only when every open connection is being answered. The one replaced is
shut down and left to its thread to end: a flood is shed as fast as it comes, not a thread's
end at a time, and only past MOST_CLOSING such threads does a new connection wait for one.
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
MOST_CLOSING = 16
"""Connections shut down whose threads have not ended yet: past it, a new connection waits
for one of them to end, then is refused rather than let threads pile up."""
CLOSING_WAIT = 1.0
"""Seconds a new connection waits, past MOST_CLOSING, for a shut-down one's thread to end. They
end within milliseconds of their shutdown, later on a busy machine: refused at once, the
scrape that came just after a flood was refused with it (the kernel's accept queue holds
what comes meanwhile)."""


@dataclass
class _Open:
    accepted: float
    deadline: float
    answering: bool = False
    closing: bool = False


class Connections:
    """The open connections of one server, with their deadlines; each is listed from its
    admission until its thread ends, so that there are never more than `most` threads
    serving and `most_closing` ending.
    Thread-safe: connections are admitted and reaped by the server's thread, marked and
    released by their own. A socket is shut down only while it is listed, and is unlisted
    before it is closed, so that a shutdown never reaches a file descriptor the system has
    since given to another connection."""

    def __init__(
        self,
        *,
        lifetime: float,
        most: int = MOST_CONNECTIONS,
        most_closing: int = MOST_CLOSING,
        head_timeout: float = HEAD_TIMEOUT,
        closing_wait: float = CLOSING_WAIT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.most = most
        self.head_timeout = head_timeout
        self.lifetime = lifetime
        self.most_closing = most_closing
        self.closing_wait = closing_wait
        self._clock = clock
        self._lock = threading.Lock()
        self._ended = threading.Condition(self._lock)
        """Told when a connection's thread ends."""
        self._open: dict[socket.socket, _Open] = {}
        self._closing = 0
        self.closed_early = 0
        """Connections closed for their deadline or to make room, and refused ones."""

    def __len__(self) -> int:
        with self._lock:
            return len(self._open)

    def admit(self, sock: socket.socket) -> bool:
        """List a new connection. When `most` are open, the one that has waited longest for
        its request is shut down (its thread ends by itself) and the new one takes its place
        at once. False (refuse it) when every open one is being answered, or when
        `most_closing` shut down are still ending after `closing_wait` seconds."""
        with self._lock:
            if self._full() and self._closing >= self.most_closing:
                self._ended.wait_for(
                    lambda: not self._full() or self._closing < self.most_closing,
                    self.closing_wait,
                )
            if self._full():
                waiting = [
                    (o.accepted, s) for s, o in self._open.items() if not (o.answering or o.closing)
                ]
                if not waiting or self._closing >= self.most_closing:
                    self.closed_early += 1
                    return False
                self._close(min(waiting, key=lambda pair: pair[0])[1])
            now = self._clock()
            self._open[sock] = _Open(accepted=now, deadline=now + self.head_timeout)
            return True

    def _full(self) -> bool:
        """With the lock held: whether `most` connections are open, not counting those shut
        down whose threads are ending."""
        return len(self._open) - self._closing >= self.most

    def answering(self, sock: socket.socket) -> None:
        """Its request's head is in: from now on only its lifetime bounds it."""
        with self._lock:
            entry = self._open.get(sock)
            if entry is not None:
                entry.answering = True
                entry.deadline = entry.accepted + self.lifetime

    def release(self, sock: socket.socket) -> None:
        """Unlist it as its thread ends (before it is closed)."""
        with self._lock:
            entry = self._open.pop(sock, None)
            if entry is not None and entry.closing:
                self._closing -= 1
            self._ended.notify_all()

    def reap(self) -> None:
        """Close the connections past their deadline."""
        now = self._clock()
        with self._lock:
            for sock, entry in self._open.items():
                if entry.deadline <= now and not entry.closing:
                    self._close(sock)

    def _close(self, sock: socket.socket) -> None:
        """With the lock held: end the connection; its thread's blocked read or write
        returns, and the thread ends and releases it."""
        self._open[sock].closing = True
        self._closing += 1
        self.closed_early += 1
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
