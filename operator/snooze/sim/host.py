"""Many simulated engines in one event loop, each listening on its own (loopback address, port)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import threading
from collections.abc import AsyncIterator, Coroutine, Iterable
from typing import Any, TypeVar

from aiohttp import web

from snooze.sim.engine import EngineConfig, SimulatedEngine
from snooze.sim.server import build_app

log = logging.getLogger(__name__)
T = TypeVar("T")
# Binding thousands of sockets at once is fine, but spreading it keeps the loop responsive.
START_BATCH = 200


def raise_fd_limit() -> int:
    """Raise the soft open-files limit to the hard one: each engine holds a listening socket."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    return soft


class EnginePool:
    """The engines served by the running loop; every method runs in that loop."""

    def __init__(self) -> None:
        self._runners: dict[SimulatedEngine, web.AppRunner] = {}

    @property
    def engines(self) -> list[SimulatedEngine]:
        return list(self._runners)

    async def add(self, config: EngineConfig, *, port: int | None = None) -> SimulatedEngine:
        """Load (startup_seconds, not listening meanwhile, like vLLM) and then listen."""
        if config.startup_seconds > 0:
            await asyncio.sleep(config.startup_seconds)
        engine = SimulatedEngine(config)
        # access_log off: 2,000 engines scraped every 10 s would log 200 lines a second.
        runner = web.AppRunner(
            build_app(engine), handle_signals=False, access_log=None, shutdown_timeout=0.1
        )
        await runner.setup()
        site = web.TCPSite(
            runner, config.host, config.port if port is None else port, reuse_address=True
        )
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        engine.port = int(runner.addresses[0][1])
        self._runners[engine] = runner
        return engine

    async def add_many(self, configs: Iterable[EngineConfig]) -> list[SimulatedEngine]:
        configs = list(configs)
        engines: list[SimulatedEngine] = []
        for start in range(0, len(configs), START_BATCH):
            batch = configs[start : start + START_BATCH]
            engines.extend(await asyncio.gather(*(self.add(c) for c in batch)))
        return engines

    async def kill(self, engine: SimulatedEngine) -> None:
        """Like a pod dying: stop listening and cut open connections, mid-stream or not."""
        runner = self._runners.pop(engine, None)
        if runner is None:
            return
        for site in list(runner.sites):
            await site.stop()
        server = runner.server
        if server is not None:
            for handler in server.connections:
                if handler.transport is not None:
                    handler.transport.abort()
        engine.kill()
        await runner.cleanup()

    async def restart(self, engine: SimulatedEngine) -> SimulatedEngine:
        """A fresh engine (awake, loaded) on the same address, like a recreated pod."""
        await self.kill(engine)
        return await self.add(engine.config, port=engine.port)

    async def remove(self, engine: SimulatedEngine) -> None:
        await self.kill(engine)

    async def close(self) -> None:
        for engine in list(self._runners):
            await self.kill(engine)


@contextlib.asynccontextmanager
async def serve_engines(configs: Iterable[EngineConfig]) -> AsyncIterator[list[SimulatedEngine]]:
    """Serve engines in the running loop for the duration of the block."""
    raise_fd_limit()
    pool = EnginePool()
    try:
        yield await pool.add_many(configs)
    finally:
        await pool.close()


class SimulatorHost:
    """Engines served from a private loop in a daemon thread; every method is thread-safe.

    For synchronous tests, and for tests whose own loop must never be blocked by the engines.
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pool = EnginePool()

    def start(self) -> SimulatorHost:
        raise_fd_limit()
        ready = threading.Event()

        def main() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=main, name="snooze-sim", daemon=True)
        self._thread.start()
        ready.wait()
        return self

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._loop is None:
            coro.close()
            raise RuntimeError("SimulatorHost is not started: call start() first")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    @property
    def engines(self) -> list[SimulatedEngine]:
        return self._pool.engines

    def add(self, config: EngineConfig) -> SimulatedEngine:
        """Start an engine; returns once it listens."""
        return self._run(self._pool.add(config))

    def add_many(self, configs: Iterable[EngineConfig]) -> list[SimulatedEngine]:
        return self._run(self._pool.add_many(configs))

    def kill(self, engine: SimulatedEngine) -> None:
        self._run(self._pool.kill(engine))

    def restart(self, engine: SimulatedEngine) -> SimulatedEngine:
        return self._run(self._pool.restart(engine))

    def remove(self, engine: SimulatedEngine) -> None:
        self._run(self._pool.remove(engine))

    def stop(self) -> None:
        if self._loop is None or self._thread is None:
            return
        self._run(self._pool.close())
        # A killed engine's request handlers may still be inside a sleep or a wake: end them
        # here, or closing the loop destroys them pending (and asyncio logs each as an error).
        self._run(_cancel_others())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop = None
        self._thread = None

    def __enter__(self) -> SimulatorHost:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def _cancel_others() -> None:
    """Cancel every other task of the running loop and wait until they have ended."""
    others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in others:
        task.cancel()
    await asyncio.gather(*others, return_exceptions=True)
