"""Run the operator inside another program, in a thread with its own loop.

The demo does, and so do the end-to-end tests: kopf cancels every task of its loop when it
stops, and a test or a traffic generator must be free to block, so neither may share it.
"""

from __future__ import annotations

import asyncio
import threading
from typing import TypeVar

from snooze.operator.actions import Settings
from snooze.operator.metrics import OperatorMetrics

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

    def start(self, timeout: float = 30.0) -> OperatorThread:
        self._thread.start()
        if not self._ready.wait(timeout) or self.error is not None:
            raise RuntimeError(f"the operator did not start: {self.error!r}")
        return self

    def _main(self) -> None:
        import kopf

        from snooze.operator.handlers import Runtime, build_registry

        try:
            asyncio.run(
                kopf.operator(
                    registry=build_registry(Runtime(settings=self.settings, metrics=self.metrics)),
                    clusterwide=True,
                    standalone=True,
                    stop_flag=self._stop,
                    ready_flag=self._ready,
                )
            )
        except BaseException as exc:  # reported by start(), or read by whoever stopped it
            self.error = exc
            self._ready.set()

    def stop(self, timeout: float = 20.0) -> None:
        self._stop.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise RuntimeError(f"the operator did not stop within {timeout}s")
