"""The engine simulator speaks vLLM's contract over real HTTP on loopback addresses."""

from __future__ import annotations

import argparse
import asyncio
import itertools
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import httpx
import openai
import pytest
from ports import free_port
from prometheus_client.parser import text_string_to_metric_families
from waits import until

from snooze.sim import EngineConfig, SimulatedEngine, SimulatorHost, serve_engines
from snooze.sim.cli import add_arguments, configs_from
from snooze.sim.device import GIB
from snooze.sim.engine import GARBAGE_MARKER

# Port 0 everywhere: other suites may run engines on the same loopback addresses at once.
_hosts = (f"127.77.{i // 250}.{i % 250 + 1}" for i in itertools.count())
FAST = EngineConfig(
    model="m",
    port=0,
    sleep_seconds=0.01,
    wake_seconds=0.01,
    kv_wake_seconds=0.0,
    reload_seconds=0.01,
    token_seconds=0.0,
    max_tokens_default=4,
)


def fast(**changes: Any) -> EngineConfig:
    return replace(FAST, host=next(_hosts), **changes)


@pytest.fixture
async def engine() -> AsyncIterator[SimulatedEngine]:
    async with serve_engines([fast()]) as [one]:
        yield one


@pytest.fixture
async def client(engine: SimulatedEngine) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=engine.url, timeout=5) as http:
        yield http


async def complete(client: httpx.AsyncClient, **extra: Any) -> dict[str, Any]:
    response = await client.post("/v1/completions", json={"model": "m", "prompt": "hi", **extra})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def test_level_1_sleep_and_wake(engine: SimulatedEngine, client: httpx.AsyncClient) -> None:
    assert (await client.post("/sleep", params={"level": 1})).json() == {
        "status": "sleeping",
        "level": 1,
    }
    assert (await client.get("/is_sleeping")).json() == {"is_sleeping": True}
    assert engine.sleep_level == 1
    assert engine.gpu_memory_bytes == FAST.asleep_memory_gib * GIB  # sleep keeps its residue
    assert (await client.get("/health")).status_code == 200
    woke = await client.post("/wake_up")
    assert woke.json() == {"status": "awake", "tags": None}
    assert not engine.is_sleeping and (engine.sleep_calls, engine.wake_calls) == (1, 1)
    text = (await complete(client))["choices"][0]["text"]
    assert GARBAGE_MARKER not in text


async def test_level_2_needs_reload(engine: SimulatedEngine, client: httpx.AsyncClient) -> None:
    await client.post("/sleep", params={"level": 2})
    await client.post("/wake_up")
    assert (await complete(client))["choices"][0]["text"].startswith(GARBAGE_MARKER)

    await client.post("/sleep", params={"level": 2})
    first = await client.post("/wake_up", params={"tags": "weights"})
    assert first.json() == {"status": "sleeping", "tags": ["weights"]}
    reload = await client.post("/collective_rpc", json={"method": "reload_weights"})
    assert reload.status_code == 200
    second = await client.post("/wake_up", params={"tags": "kv_cache"})
    assert second.json()["status"] == "awake"
    assert GARBAGE_MARKER not in (await complete(client))["choices"][0]["text"]


@pytest.mark.parametrize("level", [1, 2])
async def test_each_level_sleeps_for_its_own_time(level: int) -> None:
    # vLLM copies the weights to host RAM at level 1 only; a level-2 sleep just unmaps, so the
    # two take their own times. The other level's time is far beyond the client's timeout.
    slow = 60.0
    config = fast(sleep_seconds=0.01 if level == 1 else slow)
    config = replace(config, level2_sleep_seconds=0.01 if level == 2 else slow)
    async with (
        serve_engines([config]) as [one],
        httpx.AsyncClient(base_url=one.url, timeout=5) as http,
    ):
        answer = await http.post("/sleep", params={"level": level})
        assert answer.json() == {"status": "sleeping", "level": level}
        assert one.sleep_level == level


async def test_sleep_while_asleep_is_ignored_but_said_at_the_level_asked(
    engine: SimulatedEngine, client: httpx.AsyncClient
) -> None:
    # vLLM's executor ignores it ("already sleeping"), while the API server answers, and
    # records on its gauge, the level it was asked (0.33's serve/dev/sleep, AsyncLLM.sleep).
    await client.post("/sleep", params={"level": 1})
    again = await client.post("/sleep", params={"level": 2})
    assert again.json() == {"status": "sleeping", "level": 2}
    assert engine.sleep_level == 1 and engine.sleep_calls == 2 and engine.host_memory_bytes
    assert engine.sleep_state == "discard_all"
    await client.post("/wake_up")  # the weights were only offloaded: nothing to reload
    assert (await complete(client))["choices"][0]["text"].startswith("lorem")


async def test_unknown_wake_tag_is_only_a_warning(client: httpx.AsyncClient) -> None:
    await client.post("/sleep")
    response = await client.post("/wake_up", params={"tags": "nonsense"})
    assert response.status_code == 200 and response.json()["status"] == "sleeping"


async def test_request_to_sleeping_engine_hangs_until_wake(
    engine: SimulatedEngine, client: httpx.AsyncClient
) -> None:
    await client.post("/sleep", params={"level": 1})
    pending = asyncio.create_task(complete(client))
    await until(lambda: engine.waiting == 1)
    assert not pending.done()
    await client.post("/wake_up")
    assert (await pending)["choices"][0]["finish_reason"] == "stop"
    assert engine.requests_served == 1


@pytest.mark.parametrize(
    ("mode", "reason", "generated"),
    [("abort", "abort", None), ("wait", "length", 30), ("keep", "length", 30)],
)
async def test_sleep_modes(mode: str, reason: str, generated: int | None) -> None:
    async with (
        serve_engines([fast(token_seconds=0.002)]) as [engine],
        httpx.AsyncClient(base_url=engine.url, timeout=5) as client,
    ):
        in_flight = asyncio.create_task(complete(client, max_tokens=30))
        await until(lambda: engine.generation_tokens >= 2)
        sleeping = asyncio.create_task(client.post("/sleep", params={"mode": mode}))
        if mode == "keep":
            await sleeping
            await asyncio.sleep(0.006)  # the step running when it paused ends, as in vLLM
            stalled = engine.generation_tokens
            assert not in_flight.done() and stalled < 30
            await asyncio.sleep(0.02)  # nothing is generated while paused
            assert engine.generation_tokens == stalled
            await client.post("/wake_up")
        body = await in_flight
        await sleeping
        assert body["choices"][0]["finish_reason"] == reason
        if generated is not None:
            assert body["usage"]["completion_tokens"] == generated
        assert engine.finished == {reason: 1}


async def test_hybrid_wake_crash() -> None:
    with SimulatorHost() as host:
        engine = host.add(fast(hybrid_wake_crash=True))
        async with httpx.AsyncClient(base_url=engine.url, timeout=5) as client:
            await client.post("/sleep", params={"level": 1})
            for params in ({}, {"tags": "kv_cache"}):
                crash = await client.post("/wake_up", params=params)
                assert crash.status_code == 500
                error = crash.json()["error"]
                assert error["message"] == (
                    "Call to wake_up method failed: 'list' object has no attribute 'zero_'"
                )
                assert (error["type"], error["code"]) == ("InternalServerError", 500)
            assert (await client.get("/is_sleeping")).json() == {"is_sleeping": True}
            assert (await client.get("/health")).status_code == 200
            hanging = asyncio.create_task(complete(client))
            await until(lambda: engine.waiting == 1)
            assert not hanging.done()
            fresh = host.restart(engine)
            with pytest.raises(httpx.TransportError):
                await hanging
        assert not fresh.is_sleeping and fresh.port == engine.port
        async with httpx.AsyncClient(base_url=fresh.url, timeout=5) as client:
            assert (await complete(client))["choices"][0]["finish_reason"] == "stop"


async def test_dev_mode_off_hides_admin_endpoints() -> None:
    async with (
        serve_engines([fast(dev_mode=False)]) as [engine],
        httpx.AsyncClient(base_url=engine.url) as client,
    ):
        for method, path in [
            ("POST", "/sleep"),
            ("POST", "/wake_up"),
            ("GET", "/is_sleeping"),
            ("POST", "/collective_rpc"),
            ("POST", "/reset_prefix_cache"),
        ]:
            response = await client.request(method, path)
            assert (response.status_code, response.json()) == (404, {"detail": "Not Found"})
        assert (await client.get("/health")).status_code == 200


async def test_openai_errors(client: httpx.AsyncClient) -> None:
    wrong = await client.post("/v1/completions", json={"model": "other", "prompt": "x"})
    assert wrong.status_code == 404
    assert set(wrong.json()["error"]) == {"message", "type", "param", "code"}
    bad = await client.post("/v1/chat/completions", content=b"{nope")
    assert bad.status_code == 400 and bad.json()["error"]["code"] == 400


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_metrics_names_labels_and_filters(
    engine: SimulatedEngine, client: httpx.AsyncClient
) -> None:
    await complete(client, max_tokens=3)
    await client.post("/sleep", params={"level": 2})
    samples = _samples((await client.get("/metrics")).text)
    base = {("model_name", "m"), ("engine", "0")}
    assert samples[("vllm:num_requests_running", frozenset(base))] == 0
    assert samples[("vllm:generation_tokens_total", frozenset(base))] == 3
    success = frozenset(base | {("finished_reason", "length")})
    assert samples[("vllm:request_success_total", success)] == 1
    for state, value in [("awake", 0), ("weights_offloaded", 0), ("discard_all", 1)]:
        key = ("vllm:engine_sleep_state", frozenset(base | {("sleep_state", state)}))
        assert samples[key] == value
    assert samples[("snooze_sim_gpu_memory_used_bytes", frozenset(base))] == GIB  # the residue

    # Like prometheus_client: filters match sample names, so counters need their `_total`.
    # (/metrics/: from vLLM 0.8.5 GET /metrics is the instrumentator's, which does not filter.)
    wanted = ["vllm:request_success_total", "vllm:num_requests_waiting", "vllm:prompt_tokens"]
    filtered = await client.get("/metrics/", params={"name[]": wanted})
    names = {name for name, _ in _samples(filtered.text)}
    assert names == {"vllm:request_success_total", "vllm:num_requests_waiting"}


async def test_full_metrics_payload_parses() -> None:
    async with (
        serve_engines([fast(full_metrics=True)]) as [engine],
        httpx.AsyncClient(base_url=engine.url) as client,
    ):
        await complete(client)
        text = (await client.get("/metrics")).text
        families = {f.name: f for f in text_string_to_metric_families(text)}
        ttft = families["vllm:time_to_first_token_seconds"]
        assert ttft.type == "histogram"
        count = [s for s in ttft.samples if s.name.endswith("_count")]
        assert count[0].value == 1
        only = await client.get(
            "/metrics/", params={"name[]": "vllm:e2e_request_latency_seconds_count"}
        )
        assert len(_samples(only.text)) == 1


async def test_openai_client_streams(engine: SimulatedEngine) -> None:
    api = openai.AsyncOpenAI(base_url=f"{engine.url}/v1", api_key="unused")
    stream = await api.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "hello there"}],
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) == 5
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
    done = await api.completions.create(model="m", prompt="a b c")
    assert done.usage is not None and done.usage.prompt_tokens == 3
    assert [m.id for m in (await api.models.list()).data] == ["m"]
    with pytest.raises(openai.NotFoundError):
        await api.completions.create(model="nope", prompt="x")
    await api.close()


async def test_waiting_beyond_max_concurrency() -> None:
    async with (
        serve_engines([fast(max_concurrency=2, token_seconds=0.002)]) as [engine],
        httpx.AsyncClient(base_url=engine.url, timeout=5) as client,
    ):
        tasks = [asyncio.create_task(complete(client, max_tokens=50)) for _ in range(5)]
        await until(lambda: engine.running == 2 and engine.waiting == 3)
        await asyncio.gather(*tasks)
        assert engine.requests_served == 5


async def test_many_engines_in_one_process() -> None:
    configs = [fast() for _ in range(200)]
    async with serve_engines(configs) as engines, httpx.AsyncClient(timeout=5) as client:
        assert len({e.address for e in engines}) == 200
        answers = await asyncio.gather(*(client.get(f"{e.url}/is_sleeping") for e in engines))
        assert all(a.json() == {"is_sleeping": False} for a in answers)


async def test_kill_mid_stream_then_restart() -> None:
    with SimulatorHost() as host:
        engine = host.add(fast(token_seconds=0.005))
        async with httpx.AsyncClient(base_url=engine.url, timeout=5) as client:
            body = {"model": "m", "prompt": "x", "max_tokens": 500, "stream": True}
            async with client.stream("POST", "/v1/completions", json=body) as response:
                lines = response.aiter_lines()
                assert (await anext(lines)).startswith("data: {")
                await asyncio.to_thread(host.kill, engine)
                with pytest.raises(httpx.TransportError):
                    async for _ in lines:
                        pass
            with pytest.raises(httpx.ConnectError):
                await client.get("/health")
        fresh = host.restart(engine)
        assert fresh is not engine and fresh.requests_served == 0
        async with httpx.AsyncClient(base_url=fresh.url) as client:
            assert (await client.get("/health")).status_code == 200
        host.remove(fresh)
        assert host.engines == []


def test_cli_serves_consecutive_addresses() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        ["--host", "127.0.3.250", "--count", "3", "--no-dev-mode", "--hybrid-wake-crash"]
    )
    configs = configs_from(args)
    assert [c.host for c in configs] == ["127.0.3.250", "127.0.3.251", "127.0.3.252"]
    assert all(not c.dev_mode and c.hybrid_wake_crash and c.port == 8000 for c in configs)


async def test_loading_engine_does_not_listen_yet() -> None:
    host_address = next(_hosts)
    port = free_port(host_address)  # known before the engine binds
    config = replace(FAST, host=host_address, port=port, startup_seconds=0.3)
    with SimulatorHost() as host:
        adding = asyncio.create_task(asyncio.to_thread(host.add, config))
        async with httpx.AsyncClient(base_url=f"http://{host_address}:{port}") as client:
            with pytest.raises(httpx.ConnectError):  # vLLM listens only once the model is loaded
                await client.get("/health")
            engine = await adding
            assert engine.port == port
            assert (await client.get("/health")).status_code == 200
