"""The simulator speaks SGLang's contract, release by release, over real HTTP on loopback
addresses: release and resume by tag, pause and continue, and the ways a real server dies."""

from __future__ import annotations

import argparse
import asyncio
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from waits import until

from snooze.sim import EngineConfig, SimulatedDevice, SimulatedEngine, serve_engines
from snooze.sim.cli import add_arguments, configs_from
from snooze.sim.device import GIB
from snooze.sim.engine import GARBAGE_MARKER
from snooze.sim.sglang.contract import parse_sglang_release
from snooze.sim.sglang.engine import BUSY_RELEASE, UNMAPPED, SGLangConfig, SGLangEngine

_hosts = (f"127.79.{i // 250}.{i % 250 + 1}" for i in itertools.count())
FAST = SGLangConfig(
    model="m",
    port=0,
    sleep_seconds=0.01,
    level2_sleep_seconds=0.01,
    wake_seconds=0.01,
    kv_wake_seconds=0.0,
    reload_seconds=0.01,
    token_seconds=0.0,
    max_tokens_default=4,
    checksum_seconds_per_gib=0.0,
    gpu_memory_gib=10,
    kv_cache_gib=19,
    asleep_memory_gib=1,
)
ALL = ["kv_cache", "weights", "cuda_graph"]


def fast(**changes: Any) -> SGLangConfig:
    return replace(FAST, host=next(_hosts), **changes)


@asynccontextmanager
async def serving(**changes: Any) -> AsyncIterator[tuple[SGLangEngine, httpx.AsyncClient]]:
    async with serve_engines([fast(**changes)]) as [engine]:
        assert isinstance(engine, SGLangEngine)
        async with httpx.AsyncClient(base_url=engine.url, timeout=5) as http:
            yield engine, http


async def text(http: httpx.AsyncClient) -> str:
    answer = await http.post("/v1/completions", json={"model": "any", "prompt": "hi"})
    assert answer.status_code == 200, answer.text
    return str(answer.json()["choices"][0]["text"])


async def post(http: httpx.AsyncClient, path: str, body: Any = None) -> httpx.Response:
    return await http.post(path, json=body if body is not None else {})


async def test_release_with_a_host_copy_and_resume_serve_the_same_answers() -> None:
    async with serving(weights_cpu_backup=True) as (engine, http):
        before = await text(http)
        assert (await post(http, "/pause_generation", {"mode": "retract"})).json()["status"] == "ok"
        released = await post(http, "/release_memory_occupation", {"tags": ALL})
        assert (released.status_code, released.text) == (200, "null")
        assert engine.gpu_memory_bytes == 1 * GIB  # what release keeps: context, graphs
        assert engine.host_memory_bytes == 10 * GIB  # the weights' host copy
        assert (await post(http, "/resume_memory_occupation", {"tags": ALL})).status_code == 200
        await post(http, "/continue_generation")
        assert engine.gpu_memory_bytes == 30 * GIB
        assert await text(http) == before


async def test_without_a_host_copy_the_weights_come_back_empty_until_reloaded() -> None:
    async with serving() as (engine, http):
        before = await text(http)
        await post(http, "/pause_generation", {"mode": "retract"})
        await post(http, "/release_memory_occupation", {"tags": ALL})
        assert engine.host_memory_bytes == 0
        await post(http, "/resume_memory_occupation", {"tags": ["weights"]})
        reloaded = await post(http, "/update_weights_from_disk", {"model_path": "m"})
        assert reloaded.json() == {
            "success": True,
            "message": "Succeeded to update model weights.",
            "num_paused_requests": 0,
        }
        await post(http, "/resume_memory_occupation", {"tags": ["kv_cache", "cuda_graph"]})
        await post(http, "/continue_generation")
        assert await text(http) == before
        # Once more, resumed without the reload: garbage.
        await post(http, "/pause_generation", {"mode": "retract"})
        await post(http, "/release_memory_occupation", {"tags": ALL})
        await post(http, "/resume_memory_occupation", {"tags": ALL})
        await post(http, "/continue_generation")
        assert (await text(http)).startswith(GARBAGE_MARKER)


async def test_an_unknown_model_path_is_refused_as_sglang_does() -> None:
    async with serving() as (_, http):
        answer = await post(http, "/update_weights_from_disk", {"model_path": "other"})
        assert answer.status_code == 400 and answer.json()["success"] is False


async def test_without_the_memory_saver_a_release_answers_200_and_frees_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with serving(memory_saver=False) as (engine, http):
        await post(http, "/pause_generation", {"mode": "retract"})
        answer = await post(http, "/release_memory_occupation", {"tags": ALL})
        assert answer.status_code == 200
        assert engine.gpu_memory_bytes == 30 * GIB
        assert "will not save memory" in caplog.text
        info = (await http.get("/server_info")).json()
        assert info["enable_memory_saver"] is False


async def test_a_release_with_a_request_running_kills_the_server() -> None:
    async with serving(token_seconds=0.05, max_tokens_default=100) as (engine, http):
        running = asyncio.create_task(text(http))
        await until(lambda: engine.running == 1)
        await post(http, "/pause_generation", {"mode": "in_place"})
        with pytest.raises(httpx.HTTPError):
            await post(http, "/release_memory_occupation", {"tags": ALL})
        assert engine.death == BUSY_RELEASE
        with pytest.raises(httpx.HTTPError):
            await running  # the request in flight dies with it
        assert engine.dead


@pytest.mark.parametrize(("version", "survives"), [("0.5.20", False), ("0.5.21", True)])
async def test_retracted_requests_may_wait_through_a_release_from_0_5_21(
    version: str, survives: bool
) -> None:
    async with serving(sglang_version=version, token_seconds=0.02, max_tokens_default=20) as (
        engine,
        http,
    ):
        running = asyncio.create_task(text(http))
        await until(lambda: engine.running == 1)
        await post(http, "/pause_generation", {"mode": "retract"})
        assert engine.running_in_scheduler == 0 and engine.queued_in_scheduler == 1
        if not survives:
            with pytest.raises(httpx.HTTPError):
                await post(http, "/release_memory_occupation", {"tags": ALL})
            assert engine.death == BUSY_RELEASE
            running.cancel()
            return
        await post(http, "/release_memory_occupation", {"tags": ALL})
        await post(http, "/resume_memory_occupation", {"tags": ALL})
        await post(http, "/continue_generation")
        await running  # recomputed after the continue: it ends as if nothing happened


async def test_a_request_while_paused_waits_for_continue_and_health_times_out() -> None:
    async with serving(health_timeout_seconds=0.1) as (engine, http):
        await post(http, "/pause_generation", {"mode": "retract"})
        held = asyncio.create_task(text(http))
        await until(lambda: engine.held == 1)
        assert (await http.get("/health")).status_code == 503
        assert (await http.get("/ready")).status_code == 503
        await post(http, "/continue_generation")
        await held
        assert (await http.get("/health")).status_code == 200


@pytest.mark.parametrize(("version", "generates"), [("0.5.7", True), ("0.5.8", False)])
async def test_health_stops_generating_when_switched_off_from_0_5_8(
    version: str, generates: bool
) -> None:
    changes = {"sglang_version": version, "health_generation": False}
    async with serving(health_timeout_seconds=0.05, **changes) as (_, http):
        await post(http, "/pause_generation", {})
        assert (await http.get("/health")).status_code == (503 if generates else 200)


async def test_a_resume_of_a_tag_not_released_kills_the_server() -> None:
    async with serving() as (engine, http):
        with pytest.raises(httpx.HTTPError):
            await post(http, "/resume_memory_occupation", {"tags": ["weights"]})
        assert engine.death == "KeyError: 'weights'"


async def test_a_request_let_through_onto_released_memory_kills_the_server() -> None:
    async with serving() as (engine, http):
        await post(http, "/release_memory_occupation", {"tags": ALL})  # no pause first
        with pytest.raises(httpx.HTTPError):
            await text(http)
        assert engine.death == UNMAPPED


async def test_a_lagging_release_answers_before_its_memory_is_free() -> None:
    async with serving(release_lag_seconds=0.2) as (engine, http):
        await post(http, "/pause_generation", {"mode": "retract"})
        await post(http, "/release_memory_occupation", {"tags": ALL})
        assert engine.gpu_memory_bytes == 30 * GIB
        await until(lambda: engine.gpu_memory_bytes == 1 * GIB)


@pytest.mark.parametrize(
    ("version", "routes"),
    [
        ("0.4.9", {"/get_server_info"}),
        ("0.5.6", {"/get_server_info", "/server_info", "/model_info", "/weights_checker"}),
        (
            "0.5.20",
            {"/get_server_info", "/server_info", "/model_info", "/weights_checker", "/ready"},
        ),
    ],
)
async def test_routes_exist_from_their_first_release(version: str, routes: set[str]) -> None:
    async with serving(sglang_version=version) as (_, http):
        for path in ("/get_server_info", "/server_info", "/model_info", "/ready"):
            answer = await http.get(path)
            assert (answer.status_code != 404) == (path in routes), (version, path)
        checker = await post(http, "/weights_checker", {"action": "checksum"})
        assert (checker.status_code != 404) == ("/weights_checker" in routes)


@pytest.mark.parametrize(
    ("version", "keys"),
    [("0.5.11", None), ("0.5.12", {"checksums", "parallelism_info"}), ("0.5.13", None)],
)
async def test_the_checksum_action_from_0_5_12(version: str, keys: set[str] | None) -> None:
    async with serving(sglang_version=version, tensor_parallel_size=2) as (_, http):
        answer = await post(http, "/weights_checker", {"action": "checksum"})
        if version == "0.5.11":
            assert answer.status_code == 400
            assert answer.json() == {"success": False, "message": "Unsupported action='checksum'"}
            return
        body = answer.json()
        assert body["success"] and len(body["ranks"]) == 2
        assert ("per_engine_checksum" in body) == (version != "0.5.12")
        digests = body["ranks"][0]["checksums"]
        assert "lm_head.weight" in digests and all(len(d) == 16 for d in digests.values())


async def test_before_0_5_6_a_pause_aborts_every_request() -> None:
    async with serving(sglang_version="0.5.5", token_seconds=0.05, max_tokens_default=50) as (
        engine,
        http,
    ):
        running = asyncio.create_task(
            http.post("/v1/completions", json={"model": "m", "prompt": "p"})
        )
        await until(lambda: engine.running == 1)
        await post(http, "/pause_generation", {"mode": "retract"})  # its body is not read
        assert (await running).status_code == 400
        assert engine.finished == {"abort": 1}


async def test_the_admin_key_guards_the_admin_routes_from_0_5_8() -> None:
    async with serving(api_key="user", admin_api_key="admin") as (engine, http):
        bearer = {"Authorization": "Bearer user"}
        admin = {"Authorization": "Bearer admin"}
        assert (await http.get("/health")).status_code == 200
        assert (await http.get("/metrics")).status_code == 200
        assert (await http.get("/v1/models")).status_code == 401
        assert (await http.get("/v1/models", headers=bearer)).status_code == 200
        refused = await http.post("/pause_generation", json={}, headers=bearer)
        assert (refused.status_code, refused.json()) == (401, {"error": "Unauthorized"})
        assert not engine.generation_paused
        paused = await http.post("/pause_generation", json={}, headers=admin)
        assert paused.status_code == 200


async def test_its_metrics_have_sglangs_names_and_labels() -> None:
    async with serving(token_seconds=0.05, max_tokens_default=50) as (engine, http):
        running = asyncio.create_task(text(http))
        await until(lambda: engine.running == 1)
        page = (await http.get("/metrics", params={"name[]": "sglang:num_running_reqs"})).text
        (family,) = text_string_to_metric_families(page)
        (sample,) = family.samples
        assert sample.value == 1.0
        assert sample.labels == {
            "model_name": "m",
            "engine_type": "unified",
            "tp_rank": "0",
            "pp_rank": "0",
            "moe_ep_rank": "0",
        }
        running.cancel()
    async with serving(metrics=False) as (_, http):
        assert (await http.get("/metrics")).status_code == 404


async def test_a_vllm_and_an_sglang_engine_share_one_device() -> None:
    device = SimulatedDevice(name="gpu", memory_gib=40)
    vllm = EngineConfig(
        model="v",
        host=next(_hosts),
        port=0,
        device="gpu",
        gpu_memory_gib=5,
        kv_cache_gib=4,
        asleep_memory_gib=1,
        sleep_seconds=0.01,
        wake_seconds=0.01,
        kv_wake_seconds=0.0,
        token_seconds=0.0,
    )
    async with serve_engines([fast(device="gpu"), vllm], devices=[device]) as engines:
        sglang, other = engines
        assert isinstance(sglang, SGLangEngine) and not isinstance(other, SGLangEngine)
        assert isinstance(other, SimulatedEngine)
        assert device.used_bytes == 40 * GIB  # both awake: full
        async with httpx.AsyncClient(timeout=5) as http:
            await http.post(f"{other.url}/sleep", params={"level": 1})
            assert device.free_bytes == 9 * GIB
            await http.post(f"{sglang.url}/pause_generation", json={"mode": "retract"})
            await http.post(f"{sglang.url}/release_memory_occupation", json={"tags": ALL})
            assert device.free_bytes == 38 * GIB
            assert (await http.post(f"{other.url}/wake_up")).status_code == 200
            resumed = await http.post(f"{sglang.url}/resume_memory_occupation", json={"tags": ALL})
            assert resumed.status_code == 200
            assert device.used_bytes == 40 * GIB and device.oom_total == 0


async def test_a_resume_without_room_on_its_device_kills_the_server() -> None:
    device = SimulatedDevice(name="gpu", memory_gib=30)
    async with serve_engines([fast(device="gpu")], devices=[device]) as [engine]:
        http = httpx.AsyncClient(base_url=engine.url, timeout=5)
        await post(http, "/pause_generation", {"mode": "retract"})
        await post(http, "/release_memory_occupation", {"tags": ALL})
        assert device.allocate("another process", 20 * GIB)
        with pytest.raises(httpx.HTTPError):
            await post(http, "/resume_memory_occupation", {"tags": ALL})
        assert engine.dead and device.oom_total == 1
        await http.aclose()


def test_the_cli_serves_sglang_with_its_flags_and_timings() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        ["--engine", "sglang", "--sglang-version", "0.5.21", "--weights-cpu-backup"]
    )
    (config,) = configs_from(args)
    assert isinstance(config, SGLangConfig)
    assert (config.sglang_version, config.weights_cpu_backup, config.memory_saver) == (
        "0.5.21",
        True,
        True,
    )
    assert config.sleep_seconds == SGLangConfig().sleep_seconds  # SGLang's, not vLLM's
    (plain,) = configs_from(parser.parse_args([]))
    assert not isinstance(plain, SGLangConfig)
    with pytest.raises(SystemExit):
        parser.parse_args(["--engine", "sglang", "--sglang-version", "0.4.8"])


@pytest.mark.parametrize(
    ("text", "release"), [("0.5.23", (0, 5, 23)), ("v0.5.15.post1", (0, 5, 15))]
)
def test_a_release_is_read(text: str, release: tuple[int, int, int]) -> None:
    assert parse_sglang_release(text) == release
