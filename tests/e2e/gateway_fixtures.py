"""The gateway for end-to-end tests: served from its own thread and loop, so tests may block."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import replace
from typing import Any, TypeVar

import pytest

from snooze.gateway.server import Gateway
from snooze.gateway.settings import GatewaySettings
from snooze.kube import KubeApi
from snooze.sandbox import Sandbox

T = TypeVar("T")
# Short keepalives, so that a test sees SSE comments without waiting long.
TEST_SETTINGS = GatewaySettings(host="127.0.0.1", port=0, keepalive_seconds=0.2)


class GatewayThread:
    """A Gateway in a daemon thread with its own event loop; `call` runs code inside that loop."""

    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="gateway", daemon=True)
        self.gateway: Gateway | None = None

    def start(self) -> GatewayThread:
        self._thread.start()

        async def boot() -> Gateway:
            gateway = Gateway(self.settings, KubeApi.from_environment())
            await gateway.start()
            return gateway

        self.gateway = self.run(boot())
        return self

    def run(self, coro: Any) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(30)

    def call(self, fn: Callable[[], T]) -> T:
        """Read gateway state from inside its loop (no torn reads)."""

        async def inside() -> T:
            return fn()

        result: T = self.run(inside())
        return result

    @property
    def g(self) -> Gateway:
        """The running Gateway; read its state through `call`."""
        assert self.gateway is not None, "start() first"
        return self.gateway

    @property
    def url(self) -> str:
        assert self.gateway is not None
        return f"http://127.0.0.1:{self.gateway.port}"

    def stop(self) -> None:
        if self.gateway is not None:
            self.run(self.gateway.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


def start_gateway(**overrides: Any) -> GatewayThread:
    return GatewayThread(replace(TEST_SETTINGS, **overrides)).start()


@pytest.fixture
def gateway(sandbox: Sandbox) -> Iterator[GatewayThread]:
    thread = start_gateway()
    yield thread
    thread.stop()
