"""The engine client against simulated engines over real HTTP on loopback: every failure class."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from ports import free_port
from waits import until

from snooze.engine.activity import PROBE_METRICS
from snooze.engine.client import EngineClient, EngineHttp, SleepState, new_http_client
from snooze.engine.errors import (
    EngineHTTPError,
    EngineTimeoutError,
    EngineUnreachableError,
    HybridKVCacheReinitError,
    OutOfMemoryError,
    SleepModeDisabledError,
)
from snooze.sim import EngineConfig, EnginePool, SimulatedEngine, serve_engines
from snooze.sim.engine import GARBAGE_MARKER, WakeError

FAST = EngineConfig(
    model="m",
    host="127.0.0.2",
    port=0,
    wake_seconds=0.01,
    kv_wake_seconds=0.01,
    sleep_seconds=0.01,
    reload_seconds=0.01,
    token_seconds=0.0,
)


def config(host: str, **changes: Any) -> EngineConfig:
    return dataclasses.replace(FAST, host=host, **changes)


@pytest.fixture
async def http() -> AsyncIterator[EngineHttp]:
    async with new_http_client() as client:
        yield client


@contextlib.asynccontextmanager
async def engine_and_client(
    http: EngineHttp, cfg: EngineConfig
) -> AsyncIterator[tuple[SimulatedEngine, EngineClient]]:
    async with serve_engines([cfg]) as (engine,):
        yield engine, EngineClient(engine.url, client=http, timeout=2.0)


async def complete(engine: SimulatedEngine, tokens: int = 4) -> str:
    async with httpx.AsyncClient() as client:  # a user of the engine, not the operator
        response = await client.post(
            engine.url + "/v1/completions",
            json={"model": engine.config.model, "prompt": "hello", "max_tokens": tokens},
            timeout=10,
        )
    response.raise_for_status()
    text: str = response.json()["choices"][0]["text"]
    return text


async def test_level_1_sleep_and_wake(http: EngineHttp) -> None:
    async with engine_and_client(http, config("127.0.0.2")) as (engine, client):
        assert await client.health() is True
        assert (await client.activity()).sleep_state is SleepState.AWAKE
        await client.sleep(1)
        assert engine.is_sleeping and engine.sleep_level == 1
        assert await client.is_sleeping() is True
        assert (await client.activity()).sleep_state is SleepState.WEIGHTS_OFFLOADED
        await client.wake(1)
        assert not engine.is_sleeping
        assert await client.is_sleeping() is False
        assert (await client.activity()).sleep_state is SleepState.AWAKE
        assert GARBAGE_MARKER not in await complete(engine)


async def test_level_1_staged_wake(http: EngineHttp) -> None:
    async with engine_and_client(http, config("127.0.0.3")) as (engine, client):
        await client.sleep(1)
        calls = engine.wake_calls
        await client.wake(1, staged=True)
        assert not engine.is_sleeping
        assert engine.wake_calls == calls + 2


async def test_level_2_wake_reloads_the_weights(http: EngineHttp) -> None:
    async with engine_and_client(http, config("127.0.0.4")) as (engine, client):
        await client.sleep(2)
        assert (await client.activity()).sleep_state is SleepState.DISCARD_ALL
        await client.wake(2)
        assert not engine.is_sleeping
        assert GARBAGE_MARKER not in await complete(engine)


async def test_level_2_woken_like_level_1_serves_garbage(http: EngineHttp) -> None:
    # The control for the test above: it shows the simulator would catch a missing reload.
    async with engine_and_client(http, config("127.0.0.4")) as (engine, client):
        await client.sleep(2)
        await client.wake(1)
        assert GARBAGE_MARKER in await complete(engine)


async def test_hybrid_crash_leaves_the_engine_asleep(http: EngineHttp) -> None:
    cfg = config("127.0.0.5", hybrid_wake_crash=True)
    async with engine_and_client(http, cfg) as (engine, client):
        await client.sleep(1)
        with pytest.raises(HybridKVCacheReinitError) as caught:
            await client.wake(1)
        assert caught.value.reason == "HybridKVCacheReinit"
        assert caught.value.status == 500
        assert "'list' object has no attribute 'zero_'" in caught.value.message
        assert engine.is_sleeping
        assert await client.is_sleeping() is True
        assert await client.health() is True  # why health alone cannot detect it


async def test_wake_longer_than_its_timeout(http: EngineHttp) -> None:
    async with engine_and_client(http, config("127.0.0.6", wake_seconds=0.15)) as (engine, client):
        await client.sleep(1)
        with pytest.raises(EngineTimeoutError, match="may still be working") as caught:
            await client.wake(1, timeout=0.03)
        assert caught.value.reason == "Timeout"
        # The engine keeps waking after the client gave up, as vLLM does.
        await until(lambda: not engine.is_sleeping)
        assert await client.is_sleeping() is False


async def test_nothing_listening_is_unreachable(http: EngineHttp) -> None:
    client = EngineClient(f"http://127.0.0.7:{free_port('127.0.0.7')}", client=http)
    with pytest.raises(EngineUnreachableError) as caught:
        await client.health()
    assert caught.value.reason == "Unreachable"
    with pytest.raises(EngineUnreachableError):
        await client.activity()


async def test_killed_and_restarted_engine(http: EngineHttp) -> None:
    pool = EnginePool()
    try:
        engine = await pool.add(config("127.0.0.8", wake_seconds=5.0))
        client = EngineClient(engine.url, client=http, timeout=2.0)
        await client.sleep(1)
        # Killed in the middle of a wake: the open connection is cut.
        wake = asyncio.create_task(client.wake(1, timeout=10))
        await until(lambda: engine.ops_in_flight.get("wake") == 1)
        await pool.kill(engine)
        with pytest.raises(EngineUnreachableError, match="broke"):
            await wake
        # And dead: nothing listens any more.
        with pytest.raises(EngineUnreachableError, match="cannot connect"):
            await client.is_sleeping()
        # A recreated pod on the same address answers again, awake.
        fresh = await pool.restart(engine)
        assert fresh.url == engine.url
        assert await client.is_sleeping() is False
    finally:
        await pool.close()


async def test_other_engine_error(http: EngineHttp, monkeypatch: pytest.MonkeyPatch) -> None:
    async with engine_and_client(http, config("127.0.0.9")) as (engine, client):

        async def broken() -> None:
            raise WakeError("RuntimeError: NCCL error: unhandled system error")

        monkeypatch.setattr(engine, "reload_weights", broken)
        await client.sleep(2)
        with pytest.raises(EngineHTTPError) as caught:
            await client.wake(2)
        assert type(caught.value) is EngineHTTPError
        assert caught.value.reason == "EngineError"
        assert caught.value.status == 500
        assert caught.value.message.startswith("RuntimeError: NCCL error")
        assert caught.value.url.endswith("/collective_rpc")


async def test_out_of_memory_is_its_own_error(
    http: EngineHttp, monkeypatch: pytest.MonkeyPatch
) -> None:
    # torch's own wording (a reload), and vLLM's allocator's (a wake: see the pool tests).
    async with engine_and_client(http, config("127.0.0.31")) as (engine, client):

        async def out_of_memory() -> None:
            raise WakeError("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB")

        monkeypatch.setattr(engine, "reload_weights", out_of_memory)
        await client.sleep(2)
        with pytest.raises(OutOfMemoryError) as caught:
            await client.wake(2)
        assert caught.value.reason == "OutOfMemory"
        assert "GPUPool" in str(caught.value)


async def test_dev_mode_off(http: EngineHttp) -> None:
    async with engine_and_client(http, config("127.0.0.10", dev_mode=False)) as (_, client):
        calls = [lambda: client.sleep(1), lambda: client.wake(1), client.is_sleeping]
        for call in calls:
            with pytest.raises(SleepModeDisabledError, match="VLLM_SERVER_DEV_MODE=1") as caught:
                await call()
            assert caught.value.reason == "SleepModeDisabled"
            assert caught.value.status == 404
        # Health and metrics do not depend on dev mode.
        assert await client.health() is True
        assert (await client.activity()).in_flight == 0


async def test_activity_moves_with_traffic(http: EngineHttp) -> None:
    cfg = config("127.0.0.11", max_concurrency=2, token_seconds=0.02)
    async with engine_and_client(http, cfg) as (engine, client):
        before = await client.activity()
        assert (before.running, before.waiting) == (0, 0)
        requests = [asyncio.create_task(complete(engine, tokens=5)) for _ in range(4)]

        async def busy() -> bool:
            snapshot = await client.activity()
            return (snapshot.running, snapshot.waiting) == (2, 2)

        await until(busy)
        await asyncio.gather(*requests)
        after = await client.activity()
        assert (after.running, after.waiting) == (0, 0)
        assert after.success_total == before.success_total + 4


async def test_one_pool_many_engines(http: EngineHttp) -> None:
    configs = [config(f"127.0.1.{n}") for n in range(1, 41)]
    async with serve_engines(configs) as engines:
        clients = [EngineClient(e.url, client=http) for e in engines]
        snapshots = await asyncio.gather(*(c.activity() for c in clients))
        assert all(s.sleep_state is SleepState.AWAKE for s in snapshots)
        await asyncio.gather(*(c.sleep(1) for c in clients[::2]))
        asleep = await asyncio.gather(*(c.is_sleeping() for c in clients))
        assert asleep == [n % 2 == 0 for n in range(len(clients))]


async def test_the_prober_reads_what_the_engine_says() -> None:
    from snooze.engine.probe import Prober

    prober = Prober(limit=4, timeout=2.0)
    try:
        async with serve_engines([config("127.0.0.41")]) as (engine,):
            first = await prober.activity(engine.url)  # the share too, asked for once
            assert first.gpu_memory_utilization is not None
            assert first.sleep_state is SleepState.AWAKE and first.in_flight == 0
            await engine.sleep(2, "wait")
            later = await prober.activity(engine.url, share_known=True)
            assert later.gpu_memory_utilization is None  # not asked for again
            assert later.sleep_level == 2
            assert await prober.is_sleeping(engine.url) is True
        with pytest.raises(EngineUnreachableError, match="cannot connect"):
            await prober.activity("http://127.0.0.41:1")
    finally:
        await prober.aclose()


@pytest.mark.parametrize("version", ["0.8.4", "0.8.5", "0.33.0"])
async def test_probes_read_only_what_they_ask_on_every_release(version: str) -> None:
    """From 0.8.5 vLLM's GET /metrics serves the whole page whatever is asked: the probes go
    through /metrics/, whose filter works on every release, and read a few lines."""
    from snooze.engine.probe import Prober

    prober = Prober(limit=4, timeout=2.0)
    try:
        async with (
            serve_engines([config("127.0.0.42", vllm_version=version, full_metrics=True)]) as (
                engine,
            ),
            EngineClient(engine.url) as client,
        ):
            for _ in range(3):
                await prober.activity(engine.url, share_known=True)
                await client.activity()
            assert engine.seen["GET /metrics/"] == 6 and "GET /metrics" not in engine.seen
            async with httpx.AsyncClient() as direct:
                query = {"name[]": list(PROBE_METRICS)}
                asked = await direct.get(f"{engine.url}/metrics/", params=query)
                plain = await direct.get(f"{engine.url}/metrics", params=query)
            assert len(asked.content) < 1500  # what a probe reads
            assert (len(plain.content) > 10 * len(asked.content)) is (version != "0.8.4")
    finally:
        await prober.aclose()


@contextlib.asynccontextmanager
async def slow_engine(host: str, delay: dict[str, float]) -> AsyncIterator[str]:
    """A simulated engine behind a front that answers `/metrics` and `/is_sleeping` only after
    `delay["seconds"]`: an engine slow to answer, on its own clock."""
    from aiohttp import web

    async with serve_engines([config(host)]) as (engine,), httpx.AsyncClient() as direct:

        async def slow(request: web.Request) -> web.Response:
            await asyncio.sleep(delay["seconds"])
            answer = await direct.get(f"{engine.url}{request.path}")
            return web.Response(text=answer.text, content_type="text/plain")

        app = web.Application()
        app.router.add_get("/metrics", slow)
        app.router.add_get("/is_sleeping", slow)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, host, 0)
        await site.start()
        try:
            yield f"http://{host}:{runner.addresses[0][1]}"
        finally:
            await runner.cleanup()


async def test_a_probe_waiting_its_turn_is_not_timed_out_by_the_queue() -> None:
    """The timeout is the engine's, not the operator's queue: with one probe at a time, four
    probes of 0.3 s each all succeed under a 0.5 s timeout; one slower than it still fails."""
    from snooze.engine.probe import Prober

    delay = {"seconds": 0.3}
    prober = Prober(limit=1, timeout=0.5)
    try:
        async with slow_engine("127.0.0.42", delay) as url:
            snapshots = await asyncio.gather(*(prober.activity(url) for _ in range(4)))
            assert all(s.sleep_state is SleepState.AWAKE for s in snapshots)
            delay["seconds"] = 1.0
            with pytest.raises(EngineTimeoutError, match=r"took longer than 0\.5s"):
                await prober.activity(url)
    finally:
        await prober.aclose()


async def test_an_engine_request_waiting_its_turn_is_not_timed_out_by_the_queue() -> None:
    """The same for the sleeps' and wakes' client: a check that queued behind others in the
    operator (a sleep wave) is not counted as the engine's failure."""
    delay = {"seconds": 0.3}
    async with (
        new_http_client(max_connections=1) as shared,
        slow_engine("127.0.0.43", delay) as url,
    ):
        clients = [EngineClient(url, client=shared, timeout=0.5) for _ in range(4)]
        assert await asyncio.gather(*(c.is_sleeping() for c in clients)) == [False] * 4
        delay["seconds"] = 1.0
        with pytest.raises(EngineTimeoutError):
            await clients[0].is_sleeping()
