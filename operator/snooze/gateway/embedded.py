"""Run the gateway inside another program, in a thread with its own loop (the demo and tests)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

from snooze.gateway.metrics import GatewayMetrics
from snooze.gateway.server import Gateway
from snooze.gateway.settings import GatewaySettings
from snooze.kube.api import KubeApi

T = TypeVar("T")


class GatewayThread:
    """A gateway in a daemon thread; `run` and `call` reach inside its loop."""

    def __init__(self, settings: GatewaySettings, metrics: GatewayMetrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics or GatewayMetrics()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="gateway", daemon=True)
        self.gateway: Gateway | None = None

    def start(self) -> GatewayThread:
        self._thread.start()

        async def boot() -> Gateway:
            gateway = Gateway(self.settings, KubeApi.from_environment(), self.metrics)
            try:
                await gateway.start()
            except BaseException:
                with contextlib.suppress(Exception):
                    await gateway.stop()
                raise
            return gateway

        self.gateway = self.run(boot())
        return self

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        """Run `coro` in the gateway's loop and wait for its result."""
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout)

    def call(self, fn: Callable[[], T]) -> T:
        """Read gateway state from inside its loop (no torn reads)."""

        async def inside() -> T:
            return fn()

        return self.run(inside())

    @property
    def g(self) -> Gateway:
        """The running Gateway; read its state through `call`."""
        assert self.gateway is not None, "start() first"
        return self.gateway

    @property
    def port(self) -> int:
        return self.g.port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def held(self) -> dict[str, int]:
        """Requests held per InferenceModel name now, read inside the gateway's loop, from
        another running loop."""
        if self.gateway is None:
            return {}
        gateway = self.gateway

        async def inside() -> dict[str, int]:
            return {name: count for (_ns, name), count in gateway.holds.held.items()}

        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(inside(), self.loop))

    def stop(self) -> None:
        if self.gateway is not None:
            with contextlib.suppress(Exception):
                self.run(self.gateway.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self.loop.close()
