"""An answer passed from an engine to a client under its deadlines: the engine's first chunk
within the first-byte timeout and each later one within the idle timeout (the client's own
bound is clients.py's).

A stream has hundreds of chunks; a timer for each would cost more than the copy. So reads
share one timer per answer: each read only notes when it began, and the timer, when it rings,
either finds the read under way late and cancels the task waiting on it, as asyncio.timeout
would, or sleeps until that read's deadline (never later than it: each read's deadline is at
least one full period after the timer was last set).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeVar

import aiohttp

FIRST_BYTE_FLAG = "--upstream-first-byte-timeout"
IDLE_FLAG = "--upstream-idle-timeout"
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
