"""The SGLang client against simulated SGLang servers over real HTTP: its sleep and wake
sequences release by release, what it records, and what it refuses (asserted on what the
server saw)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import httpx
import pytest
from waits import until

from snooze.engine.errors import SleepModeDisabledError
from snooze.engine.http import EngineHttp
from snooze.engine.interface import engine_client
from snooze.engine.sglang import RequestsInFlightError, SGLangClient
from snooze.engine.sglangfacts import PAUSED, parse_server_info, parse_sglang_activity
from snooze.sim import serve_engines
from snooze.sim.device import GIB
from snooze.sim.engine import GARBAGE_MARKER
from snooze.sim.sglang.engine import SGLangEngine

from .test_sim_sglang import FAST

_hosts = (f"127.80.{i // 250}.{i % 250 + 1}" for i in itertools.count())
ALL = {"kv_cache", "weights", "cuda_graph"}


class Books:
    """What the client told its owner to keep, in order."""

    def __init__(self) -> None:
        self.told: list[frozenset[str]] = []

    async def record(self, outstanding: frozenset[str]) -> None:
        self.told.append(outstanding)


@asynccontextmanager
async def server(**changes: Any) -> AsyncIterator[tuple[SGLangEngine, EngineHttp]]:
    config = replace(FAST, host=next(_hosts), **changes)
    async with serve_engines([config]) as [engine]:
        assert isinstance(engine, SGLangEngine)
        http = EngineHttp(limit=8)
        try:
            yield engine, http
        finally:
            await http.aclose()


def client(engine: SGLangEngine, http: EngineHttp, books: Books, **kw: Any) -> SGLangClient:
    return SGLangClient(engine.url, client=http, timeout=5, record=books.record, **kw)


async def text(engine: SGLangEngine) -> str:
    async with httpx.AsyncClient(timeout=5) as http:
        answer = await http.post(f"{engine.url}/v1/completions", json={"prompt": "hi"})
        return str(answer.json()["choices"][0]["text"])


@pytest.mark.parametrize(("version", "mode"), [("0.5.23", "retract"), ("0.5.20", "in_place")])
async def test_a_level_2_cycle_releases_reloads_and_continues(version: str, mode: str) -> None:
    async with server(sglang_version=version) as (engine, http):
        before = await text(engine)
        books = Books()
        sglang = client(engine, http, books)
        await sglang.sleep(2)
        assert await sglang.is_sleeping()
        assert engine.scheduler_pause == mode and engine.released == ALL
        assert engine.gpu_memory_bytes == 1 * GIB
        # Told before each call: paused, then what is released.
        assert books.told == [frozenset({PAUSED}), frozenset({PAUSED} | ALL)]
        steps: list[str] = []

        async def step(name: str) -> None:
            steps.append(name)

        await sglang.wake(2, on_step=step)
        assert steps == ["weights", "reload_weights", "kv_cache", "continue"]
        assert not await sglang.is_sleeping() and books.told[-1] == frozenset()
        assert engine.calls["update_weights_from_disk"] == 1
        assert not engine.generation_paused and engine.gpu_memory_bytes == 30 * GIB
        assert await text(engine) == before


async def test_a_host_copy_wakes_in_one_resume() -> None:
    async with server(weights_cpu_backup=True) as (engine, http):
        books = Books()
        sglang = client(engine, http, books)
        await sglang.sleep(1)
        assert engine.host_memory_bytes == 10 * GIB
        steps: list[str] = []

        async def step(name: str) -> None:
            steps.append(name)

        await sglang.wake(1, on_step=step)
        assert steps == ["all", "continue"] and "update_weights_from_disk" not in engine.calls
        assert not (await text(engine)).startswith(GARBAGE_MARKER)


async def test_before_0_5_5_two_tags_and_a_pause_without_modes() -> None:
    async with server(sglang_version="0.5.4") as (engine, http):
        sglang = client(engine, http, Books())
        facts = await sglang.facts()
        assert facts.all_tags == ("weights", "kv_cache") and facts.pause_mode == "abort"
        assert engine.seen["GET /get_server_info"] == 1  # no /server_info before 0.5.6
        await sglang.sleep(2)
        assert engine.released == {"weights", "kv_cache"}
        await sglang.wake(2)
        assert not engine.released and not engine.generation_paused


async def test_a_wake_resumed_after_a_restart_skips_what_was_done() -> None:
    async with server() as (engine, http):
        await client(engine, http, Books()).sleep(2)
        # The operator died after the weights' resume: the books say so.
        resumed = SGLangClient(engine.url, client=http, timeout=5, outstanding=engine.released)
        await resumed._resume({"weights"}, _budget())
        books = Books()
        again = client(engine, http, books, outstanding=resumed.outstanding | {PAUSED})
        await again.wake(2, done={"weights"})
        assert engine.calls["update_weights_from_disk"] == 1 and not engine.dead
        assert engine.calls["resume_memory_occupation"] == 2
        assert not engine.released and not engine.generation_paused


def _budget() -> Any:
    from snooze.engine.sglang import _Budget

    return _Budget.of(5)


@pytest.mark.parametrize(
    ("changes", "flag"),
    [
        ({"memory_saver": False}, "--enable-memory-saver"),
        ({"metrics": False}, "--enable-metrics"),
        ({}, "--enable-weights-cpu-backup"),  # level 1 without a host copy
    ],
)
async def test_what_cannot_work_is_refused_naming_the_flag_before_anything_is_sent(
    changes: dict[str, Any], flag: str
) -> None:
    async with server(**changes) as (engine, http):
        books = Books()
        with pytest.raises(SleepModeDisabledError, match=flag):
            await client(engine, http, books).sleep(1)
        assert engine.calls == {} and books.told == []


async def test_a_request_that_reached_the_scheduler_is_never_released_under() -> None:
    async with server(sglang_version="0.5.20", token_seconds=0.02, max_tokens_default=40) as (
        engine,
        http,
    ):
        running = asyncio.create_task(text(engine))
        await until(lambda: engine.running == 1)
        books = Books()
        with pytest.raises(RequestsInFlightError, match="1 request"):
            await client(engine, http, books).sleep(2)
        assert "release_memory_occupation" not in engine.calls
        assert engine.calls["continue_generation"] == 1 and not engine.dead
        assert books.told[-1] == frozenset()
        assert not (await running).startswith(GARBAGE_MARKER)  # it ended, answered


async def test_a_server_that_wants_a_key_is_left_as_it_was() -> None:
    async with server(admin_api_key="secret") as (engine, http):
        books = Books()
        with pytest.raises(SleepModeDisabledError, match="--admin-api-key"):
            await client(engine, http, books).sleep(2)
        assert not engine.generation_paused and books.told[-1] == frozenset()


async def test_the_interface_picks_the_client_of_the_kind() -> None:
    http = EngineHttp(limit=1)
    try:
        assert isinstance(engine_client("sglang", "http://x", client=http, timeout=1), SGLangClient)
        other = engine_client("vllm", "http://x", client=http, timeout=1)
        assert not isinstance(other, SGLangClient)
    finally:
        await http.aclose()


def test_server_info_is_read_without_its_keys_and_checked() -> None:
    facts = parse_server_info(
        {
            "version": "0.5.23",
            "enable_memory_saver": True,
            "enable_metrics": True,
            "enable_weights_cpu_backup": False,
            "model_path": "Qwen/Qwen3-8B",
            "api_key": "sk-leaked",
            "admin_api_key": "sk-leaked-too",
        }
    )
    assert "sk-" not in repr(facts)
    assert facts.pause_mode == "retract" and facts.checksums
    for bad in ({}, {"version": "x"}, {"version": "0.5.23", "enable_memory_saver": "yes"}):
        with pytest.raises(ValueError):
            parse_server_info(bad)


def test_the_activity_is_summed_over_ranks_and_checked() -> None:
    page = (
        'sglang:num_running_reqs{tp_rank="0"} 2.0\n'
        'sglang:num_running_reqs{tp_rank="1"} 1.0\n'
        'sglang:num_queue_reqs{tp_rank="0"} 4.0\n'
        'sglang:num_requests_total{is_streaming="true"} 7.0\n'
        'sglang:num_requests_total{is_streaming="false"} 3.0\n'
    )
    snapshot = parse_sglang_activity(page)
    assert snapshot is not None
    assert (snapshot.running, snapshot.waiting, snapshot.success_total) == (3, 4, 10.0)
    assert snapshot.sleep_state is None
    assert parse_sglang_activity("vllm:num_requests_running 1\n") is None
    with pytest.raises(ValueError):
        parse_sglang_activity("sglang:num_running_reqs -1\n")
