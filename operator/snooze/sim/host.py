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

from snooze.api.listening import CannotListen
from snooze.sim.device import GIB, SimulatedDevice
from snooze.sim.engine import EngineConfig, SimulatedEngine
from snooze.sim.kinds import app_for, new_engine

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


class AddressUnavailable(CannotListen):
    """An engine cannot listen on its address: in use, not on this machine, or not allowed."""


class EngineDoesNotFit(ValueError):
    """An engine's footprint is larger than its whole device: it could never start."""


class EnginePool:
    """The engines served by the running loop, and the devices they share; every method runs in
    that loop."""

    def __init__(self, devices: Iterable[SimulatedDevice] = ()) -> None:
        self._runners: dict[SimulatedEngine, web.AppRunner] = {}
        self._dying: set[asyncio.Task[None]] = set()
        self.devices: dict[str, SimulatedDevice] = {}
        """Shared devices by name: an engine whose config names one runs on it."""
        for device in devices:
            self.add_device(device)

    @property
    def engines(self) -> list[SimulatedEngine]:
        return list(self._runners)

    def add_device(self, device: SimulatedDevice) -> SimulatedDevice:
        known = self.devices.get(device.name)
        if known is not None and known is not device:
            raise ValueError(f"a device named {device.name!r} is already in this pool")
        self.devices[device.name] = device
        return device

    def _device_for(self, config: EngineConfig) -> SimulatedDevice | None:
        if config.device is None:
            return None
        device = self.devices.get(config.device)
        if device is None:
            raise ValueError(
                f"engine {config.host}: no device named {config.device!r} in this pool"
                f" (known: {sorted(self.devices) or 'none'}); add it first with"
                " add_device(SimulatedDevice(name=..., memory_gib=...))"
            )
        if not device.shared:
            raise ValueError(f"device {device.name!r} is private to one engine")
        return device

    async def add(self, config: EngineConfig, *, port: int | None = None) -> SimulatedEngine:
        """Start an engine as vLLM does; returns once it listens.

        With room on its device it takes its memory, loads (startup_seconds, not listening
        meanwhile, like vLLM) and listens. Without room it listens at once but answers 503, as
        a container that keeps failing and restarting would, and retries in the background.
        """
        engine = new_engine(config, self._device_for(config))
        # An engine that dies by itself (vllm#45520) stops answering, as its container would.
        engine.on_crash = lambda: self._crashed(engine)
        device, footprint = engine.device, engine.memory.footprint_bytes
        if footprint > device.total_bytes:
            raise EngineDoesNotFit(
                f"engine {config.host}: its footprint ({footprint / GIB:.2f} GiB: weights, KV"
                f" cache and {config.asleep_memory_gib} GiB that sleep keeps) exceeds device"
                f" {device.name!r} ({device.total_bytes / GIB:.2f} GiB): it could never start"
            )
        loaded = engine.try_to_load()
        if loaded:
            await engine.load_model()
        try:
            await self._listen(engine, port)
        except BaseException:
            engine.memory.release_all()
            raise
        if not loaded:
            engine.retry_start()
        return engine

    async def _listen(self, engine: SimulatedEngine, port: int | None) -> None:
        config = engine.config
        # access_log off: 2,000 engines scraped every 10 s would log 200 lines a second.
        runner = web.AppRunner(
            app_for(engine), handle_signals=False, access_log=None, shutdown_timeout=0.1
        )
        await runner.setup()
        port = config.port if port is None else port
        site = web.TCPSite(runner, config.host, port, reuse_address=True)
        try:
            await site.start()
        except OSError as error:
            await runner.cleanup()
            raise AddressUnavailable(config.host, port, error) from error
        except BaseException:
            await runner.cleanup()
            raise
        engine.port = int(runner.addresses[0][1])
        self._runners[engine] = runner

    async def add_many(self, configs: Iterable[EngineConfig]) -> list[SimulatedEngine]:
        """Start engines, a batch at a time; if one cannot start, none of them stays."""
        configs = list(configs)
        engines: list[SimulatedEngine] = []
        failure: BaseException | None = None
        for start in range(0, len(configs), START_BATCH):
            batch = configs[start : start + START_BATCH]
            for result in await asyncio.gather(
                *(self.add(c) for c in batch), return_exceptions=True
            ):
                if isinstance(result, SimulatedEngine):
                    engines.append(result)
                elif failure is None:
                    failure = result
            if failure is not None:
                for engine in engines:
                    await self.kill(engine)
                raise failure
        return engines

    def _crashed(self, engine: SimulatedEngine) -> None:
        task = asyncio.get_running_loop().create_task(self.kill(engine))
        self._dying.add(task)
        task.add_done_callback(self._dying.discard)

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
async def serve_engines(
    configs: Iterable[EngineConfig], *, devices: Iterable[SimulatedDevice] = ()
) -> AsyncIterator[list[SimulatedEngine]]:
    """Serve engines in the running loop for the duration of the block."""
    raise_fd_limit()
    pool = EnginePool(devices)
    try:
        yield await pool.add_many(configs)
    finally:
        await pool.close()


class SimulatorHost:
    """Engines served from a private loop in a daemon thread; every method is thread-safe.

    For synchronous tests, and for tests whose own loop must never be blocked by the engines.
    """

    def __init__(self, devices: Iterable[SimulatedDevice] = ()) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pool = EnginePool(devices)

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

    @property
    def devices(self) -> dict[str, SimulatedDevice]:
        return self._pool.devices

    def add_device(self, *, name: str, memory_gib: float) -> SimulatedDevice:
        """A GPU that engines share: those whose config says `device=name` run on it."""
        return self._pool.add_device(SimulatedDevice(name=name, memory_gib=memory_gib))

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
