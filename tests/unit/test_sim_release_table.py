"""Each route the operator uses or may meet, against each simulated vLLM release: what the
simulator answers must be what the release's source does.

The expectations below are not read from the simulator's own contract (sim/contract.py): they
were written from the released wheels (`pip download --no-deps vllm==X`), each with the file
it was read in, bisecting between neighbouring releases (docs/vllm-contract.md has the same
facts with their sources).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from waits import until

from snooze.sim import SimulatedEngine, serve_engines

from .test_sim import fast

Release = tuple[int, int, int]

# The first release with each behaviour, as read in the wheels.
FIRST = {
    # entrypoints/openai/api_server.py: `wake_up(tags)` reads query_params.getlist("tags").
    "wake_tags": (0, 8, 3),
    # entrypoints/openai/api_server.py: @router.post("/collective_rpc") under DEV_MODE.
    "collective_rpc": (0, 10, 2),
    # mount_metrics: Instrumentator(...).expose(app) registered before the prometheus_client
    # Mount, unconditionally from 0.8.5 (0.8.3 and 0.8.4: only with PROMETHEUS_MULTIPROC_DIR).
    "metrics_unfiltered": (0, 8, 5),
    # v1/metrics/loggers.py: gauge_engine_sleep_state.
    "sleep_state_gauge": (0, 11, 1),
    # openai/api_server.py: @app.exception_handler(HTTPException) -> ErrorResponse.
    "http_exception_handler": (0, 9, 0),
    # openai/protocol.py: `class ErrorResponse: error: ErrorInfo` (before: flat fields).
    "nested_errors": (0, 10, 1),
    # openai/server_utils.py: app.exception_handler(Exception) -> JSON 500.
    "json_500": (0, 18, 0),
    # openai/api_server.py, later serve/rlhf, serve/dev/rlhf, rl/online: /pause, /is_paused.
    "pause_routes": (0, 12, 0),
    # v1/engine/core.py: sleep() calls pause_scheduler; is_sleeping() includes the pause;
    # wake_up() calls resume_scheduler; AsyncLLM.is_paused asks the engine core.
    "shared_pause": (0, 17, 0),
    # entrypoints/serve/dev/sleep/api_router.py: JSON answers; `level: Query(ge=0, le=2)`.
    "json_sleep_answers": (0, 32, 0),
    # entrypoints/serve/dev/sleep/metrics.py: created at the first operation.
    "sleep_op_metrics": (0, 32, 0),
    # entrypoints/rl/online/api_router.py: @router.post("/weight_checker").
    "weight_checker": (0, 32, 0),
    # entrypoints/serve/dev/sleep/api_router.py: @router.post("/release_kv_cache_memory").
    "release_kv_cache_memory": (0, 31, 0),
    # v1/engine/async_llm.py and v1/engine/core.py: a wake is recorded awake, and resumes the
    # scheduler (0.17+), only once all the memory is back; before, after any wake.
    "waits_for_a_full_wake": (0, 31, 0),
}
RELEASES = [
    "0.8.0",
    "0.8.2",
    "0.8.3",
    "0.8.4",
    "0.8.5",
    "0.9.0",
    "0.10.0",
    "0.10.1",
    "0.10.2",
    "0.11.0",
    "0.11.1",
    "0.12.0",
    "0.16.0",
    "0.17.0",
    "0.18.0",
    "0.30.0",
    "0.31.0",
    "0.32.0",
    "0.33.0",
    "0.34.0",
]
RUNNING = "vllm:num_requests_running"


def release(version: str) -> Release:
    major, minor, patch = (int(part) for part in version.split("."))
    return major, minor, patch


def has(version: str, feature: str) -> bool:
    return release(version) >= FIRST[feature]


@asynccontextmanager
async def serving(version: str, **changes: Any) -> AsyncIterator[tuple[SimulatedEngine, Any]]:
    config = fast(vllm_version=version, checksum_seconds_per_gib=0.0, **changes)
    async with (
        serve_engines([config]) as [engine],
        httpx.AsyncClient(base_url=engine.url, timeout=5) as http,
    ):
        yield engine, http


def families(text: str) -> set[str]:
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


def sleep_state(text: str) -> dict[str, float]:
    found = {}
    for line in text.splitlines():
        if line.startswith("vllm:engine_sleep_state{"):
            state = line.split('sleep_state="')[1].split('"')[0]
            found[state] = float(line.rsplit(" ", 1)[1])
    return found


@pytest.mark.parametrize("version", RELEASES)
async def test_the_routes_a_release_mounts(version: str) -> None:
    async with serving(version) as (_, http):
        paths = {
            "collective_rpc": ("POST", "/collective_rpc"),
            "pause_routes": ("GET", "/is_paused"),
            "weight_checker": ("POST", "/weight_checker"),
            "release_kv_cache_memory": ("POST", "/release_kv_cache_memory"),
        }
        for feature, (method, path) in paths.items():
            answer = await http.request(method, path, json={})
            mounted = answer.status_code != 404
            assert mounted is has(version, feature), (version, path, answer.text)
            if not mounted:  # FastAPI's own 404, in every release
                assert answer.json() == {"detail": "Not Found"}
        assert (await http.get("/version")).json() == {"version": version}


@pytest.mark.parametrize("version", RELEASES)
async def test_wake_tags_are_read_from_0_8_3(version: str) -> None:
    async with serving(version) as (engine, http):
        await http.post("/sleep", params={"level": 1})
        await http.post("/wake_up", params={"tags": "weights"})
        # 0.8.0 to 0.8.2: `wake_up()` takes no tags, everything wakes.
        assert engine.kv_on_gpu is not has(version, "wake_tags")
        assert (await http.get("/is_sleeping")).json()["is_sleeping"] is has(version, "wake_tags")


@pytest.mark.parametrize("version", RELEASES)
async def test_which_metrics_path_filters(version: str) -> None:
    async with serving(version) as (_, http):
        ask = {"name[]": RUNNING}
        plain = families((await http.get("/metrics", params=ask)).text)
        slash = families((await http.get("/metrics/", params=ask)).text)
        assert slash == {RUNNING}  # prometheus_client's mount, in every release
        assert (plain == {RUNNING}) is not has(version, "metrics_unfiltered")


@pytest.mark.parametrize("version", RELEASES)
async def test_error_shapes(version: str) -> None:
    async with serving(version) as (_, http):
        missing = await http.get("/no/such/route")
        assert missing.status_code == 404 and missing.json() == {"detail": "Not Found"}
        # vLLM's own errors: a model it does not serve, a request it cannot read.
        for body, status in (({"model": "other", "prompt": "x"}, 404), ({"model": "m"}, 400)):
            answer = await http.post("/v1/completions", json=body)
            assert answer.status_code == status, answer.text  # never FastAPI's 422
            data = answer.json()
            if has(version, "nested_errors"):
                assert set(data) == {"error"} and data["error"]["code"] == status
            else:
                assert data["object"] == "error" and data["code"] == status
        if has(version, "collective_rpc"):  # an HTTPException, through vLLM's handler
            data = (await http.post("/collective_rpc", json={})).json()
            assert data["error"]["message"] == "Missing 'method' in request body"


@pytest.mark.parametrize("version", RELEASES)
async def test_an_uncaught_error_is_json_from_0_18(version: str) -> None:
    async with serving(version, hybrid_wake_crash=True) as (_, http):
        await http.post("/sleep", params={"level": 1})
        answer = await http.post("/wake_up")
        assert answer.status_code == 500
        if has(version, "json_500"):
            assert "zero_" in answer.json()["error"]["message"]
        else:
            assert answer.text == "Internal Server Error"


@pytest.mark.parametrize("version", RELEASES)
async def test_a_bad_sleep_level(version: str) -> None:
    async with serving(version) as (engine, http):
        answer = await http.post("/sleep", params={"level": "deep"})
        if has(version, "json_sleep_answers"):  # a declared Query: the validation handler
            assert answer.status_code == 400 and answer.json()["error"]["param"] == "query.level"
        elif has(version, "json_500"):  # int(level)'s ValueError, the client's fault from 0.18
            assert answer.status_code == 400
        else:
            assert answer.status_code == 500
        assert not engine.is_sleeping


@pytest.mark.parametrize("version", RELEASES)
async def test_the_sleep_state_gauge_through_sleeps(version: str) -> None:
    async with serving(version) as (engine, http):

        async def gauge() -> dict[str, float]:
            return sleep_state((await http.get("/metrics/")).text)

        if not has(version, "sleep_state_gauge"):
            assert await gauge() == {}
            return
        assert await gauge() == {"awake": 1, "weights_offloaded": 0, "discard_all": 0}
        await http.post("/sleep", params={"level": 1})
        again = await http.post("/sleep", params={"level": 2})
        # The executor ignores a sleep while asleep; the gauge (and from 0.32 the answer) take
        # the level asked all the same.
        assert await gauge() == {"awake": 0, "weights_offloaded": 0, "discard_all": 1}
        assert engine.sleep_level == 1 and engine.host_memory_bytes > 0
        if has(version, "json_sleep_answers"):
            assert again.json() == {"status": "sleeping", "level": 2}
        await http.post("/wake_up", params={"tags": "weights"})
        partial = await gauge()
        # Before 0.31 any wake, partial or not, is recorded as awake.
        assert (partial["awake"] == 0) is has(version, "waits_for_a_full_wake")
        await http.post("/wake_up")
        assert await gauge() == {"awake": 1, "weights_offloaded": 0, "discard_all": 0}


@pytest.mark.parametrize("version", RELEASES)
async def test_level_0(version: str) -> None:
    async with serving(version) as (engine, http):
        await http.post("/sleep", params={"level": 0})
        assert (await http.get("/is_sleeping")).json() == {"is_sleeping": True}
        if has(version, "sleep_state_gauge"):  # record_sleep_state(1, 0): every series 0
            assert set(sleep_state((await http.get("/metrics/")).text).values()) == {0.0}
        if has(version, "shared_pause"):
            # Only the scheduler pauses; any wake resumes it.
            assert engine.weights_on_gpu and engine.kv_on_gpu
            await http.post("/wake_up", params={"tags": "scheduling"})
            assert (await http.get("/is_sleeping")).json() == {"is_sleeping": False}
        else:
            # Straight to the executor, whose workers keep nothing but at level 1: everything
            # is discarded, the model's buffers with it, and no reload brings those back.
            assert not engine.weights_on_gpu and not engine.host_memory_bytes
            await http.post("/wake_up")
            if has(version, "collective_rpc"):
                await http.post("/collective_rpc", json={"method": "reload_weights"})
            answer = await http.post("/v1/completions", json={"model": "m", "prompt": "x"})
            assert "<garbage" in answer.json()["choices"][0]["text"]


@pytest.mark.parametrize("version", [v for v in RELEASES if has(v, "pause_routes")])
async def test_pause_and_sleep_share_one_state_from_0_17(version: str) -> None:
    shared = has(version, "shared_pause")
    async with serving(version) as (_, http):
        await http.post("/sleep", params={"level": 1})
        assert (await http.get("/is_paused")).json() == {"is_paused": shared}
        await http.post("/wake_up")
        await http.post("/pause")
        assert (await http.get("/is_sleeping")).json() == {"is_sleeping": shared}
        await http.post("/wake_up")  # resumes the one scheduler: the pause ends with it
        assert (await http.get("/is_paused")).json() == {"is_paused": not shared}


@pytest.mark.parametrize("version", ["0.17.0", "0.33.0"])
async def test_resume_while_asleep_runs_the_next_request_on_unmapped_memory(version: str) -> None:
    async with serving(version) as (engine, http):
        await http.post("/sleep", params={"level": 1})
        await http.post("/resume")
        assert (await http.get("/is_sleeping")).json() == {"is_sleeping": True}  # the executor
        try:  # the request dies with its engine core
            answer = await http.post("/v1/completions", json={"model": "m", "prompt": "x"})
            assert answer.status_code >= 500
        except httpx.TransportError:
            pass
        await until(lambda: engine.dead)
        assert engine.crashed


@pytest.mark.parametrize("version", [v for v in RELEASES if has(v, "sleep_op_metrics")])
async def test_the_sleep_operation_metrics_appear_at_their_first_use(version: str) -> None:
    async with serving(version) as (_, http):
        names = ["vllm:sleep_mode_operations_in_flight"]

        async def in_flight() -> str:
            return (await http.get("/metrics/", params={"name[]": names})).text

        assert await in_flight() == ""  # not created before the first sleep or wake
        await http.post("/sleep", params={"level": 1})
        after_sleep = await in_flight()
        assert 'operation="sleep"} 0.0' in after_sleep and "wake" not in after_sleep
        await http.post("/wake_up")
        assert 'operation="wake"} 0.0' in await in_flight()


@pytest.mark.parametrize("version", ["0.32.0", "0.33.0", "0.34.0"])
async def test_weight_checker_on_a_sleeping_engine_kills_it(version: str) -> None:
    async with serving(version) as (engine, http):
        await http.post("/sleep", params={"level": 1})
        answer = await http.post("/weight_checker", json={"action": "checksum"})
        # No guard in vLLM: the copy reads unmapped memory, and CUDA's error is sticky.
        assert answer.status_code == 500 and "illegal memory access" in answer.text
        await until(lambda: engine.dead)


@pytest.mark.parametrize("version", [v for v in RELEASES if has(v, "release_kv_cache_memory")])
async def test_release_kv_cache_memory(version: str) -> None:
    async with serving(version) as (engine, http):
        refused = await http.post("/release_kv_cache_memory")
        assert refused.status_code == 500 and "requires a completed pause" in refused.text
        await http.post("/sleep", params={"level": 0})
        released = await http.post("/release_kv_cache_memory")
        assert released.status_code == 200 and not engine.kv_on_gpu and engine.weights_on_gpu
        assert set(sleep_state((await http.get("/metrics/")).text).values()) == {0.0}
        await http.post("/wake_up")
        assert engine.kv_on_gpu and (await http.get("/is_sleeping")).json()["is_sleeping"] is False


@pytest.mark.parametrize(
    ("layers", "tp", "kilobytes"),
    [(32, 4, 98), (80, 8, 490)],  # a Llama-3-8B at tensor parallel 4; a 70B at 8
)
async def test_weight_checker_answers_are_sized_as_a_real_model(
    layers: int, tp: int, kilobytes: int
) -> None:
    async with serving("0.33.0", num_layers=layers, tensor_parallel_size=tp) as (_, http):
        answer = await http.post("/weight_checker", json={"action": "checksum"})
        assert len(answer.json()["checksums"]) == (6 * layers + 3) * tp
        assert abs(len(answer.content) / 1000 - kilobytes) < 0.1 * kilobytes


async def test_a_request_is_not_lost_between_two_routes() -> None:
    """What the table's engines serve stays usable: a greedy request after all of it."""
    async with serving("0.33.0") as (_, http):
        await http.post("/sleep", params={"level": 2})
        for tags in ("weights", None):
            if tags is None:
                await http.post("/collective_rpc", json={"method": "reload_weights"})
            await http.post("/wake_up", params={"tags": tags or "kv_cache"})
        answer = await asyncio.wait_for(
            http.post("/v1/completions", json={"model": "m", "prompt": "x"}), 3
        )
        assert "<garbage" not in answer.json()["choices"][0]["text"]


@pytest.mark.parametrize("version", ["0.17.0", "0.30.0", "0.31.0", "0.33.0"])
async def test_a_partial_wake_resumes_the_scheduler_before_0_31(version: str) -> None:
    async with serving(version) as (engine, http):
        await http.post("/sleep", params={"level": 1})
        await http.post("/wake_up", params={"tags": "weights"})
        resumed = not has(version, "waits_for_a_full_wake")
        assert (await http.get("/is_paused")).json() == {"is_paused": not resumed}
        assert (await http.get("/is_sleeping")).json() == {"is_sleeping": True}  # its KV cache
        if resumed:  # the next request runs on a KV cache that sleeps
            try:
                answer = await http.post("/v1/completions", json={"model": "m", "prompt": "x"})
                assert answer.status_code >= 500
            except httpx.TransportError:
                pass
            await until(lambda: engine.dead)
