"""A watch over the task that enters it, which something outside the task may interrupt (a
timer that finds a client stalled, an engine found stuck): the task is cancelled, and leaves
the watch with the watch's own error instead, as asyncio.timeout turns its cancellation
into TimeoutError. Any other cancellation (the client left) goes through as it is."""

from __future__ import annotations

import abc
import asyncio
from types import TracebackType
from typing import Self


class Interruptible(abc.ABC):
    """The base of such watches; `_enter`, `_leave` and `_error` are theirs to say."""

    interrupted = False

    async def __aenter__(self) -> Self:
        task = asyncio.current_task()
        assert task is not None
        self._task: asyncio.Task[object] = task
        self._cancelling = task.cancelling()
        self._enter()
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._leave()
        if (
            kind is asyncio.CancelledError
            and self.interrupted
            and self._task.uncancel() <= self._cancelling
        ):
            raise self._error() from None

    def interrupt(self) -> None:
        """Cancel the task inside the watch; it leaves with `_error()`."""
        self.interrupted = True
        self._task.cancel()

    def _enter(self) -> None:  # noqa: B027 (an optional hook: most watches need none)
        """The task has entered."""

    def _leave(self) -> None:  # noqa: B027 (an optional hook)
        """The task leaves, however."""

    @abc.abstractmethod
    def _error(self) -> Exception:
        """What the interrupted task raises: each kind of watch says why it cut the task."""
