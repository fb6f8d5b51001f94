"""Run the operator inside another program, in a thread with its own loop.

The demo does, and so do the end-to-end tests: kopf cancels every task of its loop when it
stops, and a test or a traffic generator must be free to block, so neither may share it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import TypeVar

from snooze.operator.metrics import OperatorMetrics
from snooze.operator.settings import Settings

T = TypeVar("T")


class OperatorThread:
    """The real operator (kopf and Snooze's handlers) in a daemon thread."""

    def __init__(self, settings: Settings, metrics: OperatorMetrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics or OperatorMetrics()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="operator", daemon=True)
        self.error: BaseException | None = None
        self._halt: Callable[[], object] = lambda: None

    def start(self, timeout: float = 30.0) -> OperatorThread:
        self._thread.start()
        if not self._ready.wait(timeout) or self.error is not None:
            raise RuntimeError(f"the operator did not start: {self.error!r}")
        return self

    def _main(self) -> None:
        from snooze.operator.runner import serve
        from snooze.operator.runtime import Runtime

        runtime = Runtime(settings=self.settings, metrics=self.metrics)

        async def main() -> None:
            loop = asyncio.get_running_loop()
            # kopf's stop flag is an asyncio one: stop() sets it from this loop.
            self._halt = lambda: loop.call_soon_threadsafe(lambda: runtime.restart())
            await serve(
                runtime, stop=self._stop, ready=self._ready, clusterwide=True, standalone=True
            )

        try:
            asyncio.run(main())
        except BaseException as exc:  # reported by start(), or read by whoever stopped it
            self.error = exc
            self._ready.set()

    def stop(self, timeout: float = 20.0) -> None:
        self._stop.set()
        with contextlib.suppress(RuntimeError):  # the loop is closed: it has stopped already
            self._halt()
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise RuntimeError(f"the operator did not stop within {timeout}s")
