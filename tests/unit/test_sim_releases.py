"""The simulator speaks each vLLM release's contract for the routes wake integrity relies on
(/pause, /resume, /is_paused, /weight_checker, /weight_info, /sleep's mode and answers), and
fails as broken engines do: wrong weights or answers after a wake, a greedy answer that varies,
a /sleep that kills a parallel engine with requests in flight (vllm#45520)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from waits import until

from snooze.sim import SimulatedEngine, serve_engines
from snooze.sim.contract import parse_release
from snooze.sim.outputs import CORRUPTED, tensors

from .test_sim import fast

GREEDY = {"model": "m", "prompt": "count: one, two,", "max_tokens": 6, "temperature": 0}


@asynccontextmanager
async def serving(**changes: Any) -> AsyncIterator[tuple[SimulatedEngine, httpx.AsyncClient]]:
    # The weights check costs nothing here unless a test gives it a cost.
    config = fast(**({"checksum_seconds_per_gib": 0.0} | changes))
    async with (
        serve_engines([config]) as [engine],
        httpx.AsyncClient(base_url=engine.url, timeout=5) as http,
    ):
        yield engine, http


async def tokens(http: httpx.AsyncClient) -> list[int]:
    answer = await http.post("/v1/completions", json={**GREEDY, "return_token_ids": True})
    assert answer.status_code == 200, answer.text
    ids: list[int] = answer.json()["choices"][0]["token_ids"]
    return ids


async def checksums(http: httpx.AsyncClient) -> dict[str, str]:
    answer = await http.post("/weight_checker", json={"action": "checksum"})
    assert answer.status_code == 200, answer.text
    found: dict[str, str] = answer.json()["checksums"]
    return found


async def sleep_and_wake(http: httpx.AsyncClient, level: int = 1) -> None:
    assert (await http.post("/sleep", params={"level": level})).status_code == 200
    if level == 2:
        await http.post("/wake_up", params={"tags": "weights"})
        await http.post("/collective_rpc", json={"method": "reload_weights"})
        await http.post("/wake_up", params={"tags": "kv_cache"})
    else:
        await http.post("/wake_up")


# --- which release has which route -------------------------------------------------------------

ROUTES = [("POST", "/pause"), ("POST", "/resume"), ("GET", "/is_paused")]


@pytest.mark.parametrize(
    ("version", "dev_mode", "served"),
    [
        ("0.11.2", True, False),  # before 0.12.0: no such routes
        ("0.12.0", False, True),  # 0.12 to 0.15 mount them even without dev mode
        ("0.15.0", False, True),
        ("0.16.0", False, False),  # from 0.16.0 only in dev mode
        ("0.16.0", True, True),
        ("0.33.0", True, True),
    ],
)
async def test_the_pause_routes_exist_where_the_release_has_them(
    version: str, dev_mode: bool, served: bool
) -> None:
    async with serving(vllm_version=version, dev_mode=dev_mode) as (_, http):
        for method, path in ROUTES:
            answer = await http.request(method, path)
            assert (answer.status_code == 200) is served, (version, path, answer.text)
            if not served:
                assert answer.json() == {"detail": "Not Found"}


@pytest.mark.parametrize(
    ("version", "checker", "info"),
    [
        ("0.26.0", False, False),
        ("0.27.0", False, True),
        ("0.31.0", False, True),
        ("0.32.0", True, True),
    ],
)
async def test_the_weight_routes_exist_from_their_first_release(
    version: str, checker: bool, info: bool
) -> None:
    async with serving(vllm_version=version) as (_, http):
        check = await http.post("/weight_checker", json={"action": "checksum"})
        assert (check.status_code == 200) is checker, check.text
        weight_info = await http.get("/weight_info")
        assert (weight_info.status_code == 200) is info
        if info:
            assert weight_info.json() == {"weight_version": "default"}
        assert (await http.get("/version")).json() == {"version": version}


@pytest.mark.parametrize(("version", "served"), [("0.10.1", False), ("0.10.2", True)])
async def test_collective_rpc_from_0_10_2(version: str, served: bool) -> None:
    async with serving(vllm_version=version) as (_, http):
        answer = await http.post("/collective_rpc", json={"method": "reload_weights"})
        assert (answer.status_code != 404) is served


async def test_no_dev_mode_no_weight_checker() -> None:
    async with serving(dev_mode=False) as (_, http):
        assert (await http.post("/weight_checker", json={"action": "checksum"})).status_code == 404


@pytest.mark.parametrize(("version", "body"), [("0.31.0", b""), ("0.32.0", b'{"status"')])
async def test_sleep_and_wake_answer_json_from_0_32(version: str, body: bytes) -> None:
    async with serving(vllm_version=version) as (_, http):
        slept = await http.post("/sleep", params={"level": 1})
        woke = await http.post("/wake_up")
        for answer in (slept, woke):
            assert answer.status_code == 200 and answer.content.startswith(body)


@pytest.mark.parametrize(("version", "waited"), [("0.16.0", False), ("0.17.0", True)])
async def test_sleep_reads_its_mode_from_0_17(version: str, waited: bool) -> None:
    """mode=wait lets a request in flight finish; a release before 0.17 aborts it."""
    async with serving(vllm_version=version, token_seconds=0.05) as (engine, http):
        running = asyncio.create_task(
            http.post("/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 8})
        )
        await until(lambda: engine.running == 1)
        await http.post("/sleep", params={"level": 1, "mode": "wait"})
        answer = await running
        assert answer.json()["choices"][0]["finish_reason"] == ("length" if waited else "abort")


def test_a_release_is_read_and_a_bad_one_refused() -> None:
    assert parse_release("0.33.0") == (0, 33, 0) and parse_release("v0.8") == (0, 8, 0)
    for bad in ("latest", "0.33.0+cu129", "0.7.3"):
        with pytest.raises(ValueError):
            parse_release(bad)


# --- /pause, /resume, /is_paused ---------------------------------------------------------------


@pytest.mark.parametrize(("version", "rejected"), [("0.32.0", False), ("0.33.0", True)])
async def test_a_request_while_paused_waits_before_0_33_and_gets_503_from_it(
    version: str, rejected: bool
) -> None:
    async with serving(vllm_version=version) as (engine, http):
        assert (await http.post("/pause", params={"mode": "abort"})).json() == {"status": "paused"}
        assert (await http.get("/is_paused")).json() == {"is_paused": True}
        request = asyncio.create_task(http.post("/v1/completions", json=GREEDY))
        if rejected:
            answer = await request
            assert answer.status_code == 503
            assert answer.json()["error"]["message"].startswith("Generation is paused")
        else:
            await until(lambda: engine.waiting == 1)
            assert not request.done()
        assert (await http.post("/resume")).json() == {"status": "resumed"}
        assert (await http.get("/is_paused")).json() == {"is_paused": False}
        if not rejected:
            assert (await request).status_code == 200


async def test_pause_keep_freezes_and_resume_carries_on() -> None:
    async with serving(token_seconds=0.02) as (engine, http):
        running = asyncio.create_task(
            http.post("/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 5})
        )
        await until(lambda: engine.running == 1)
        await http.post("/pause", params={"mode": "keep"})
        queued = asyncio.create_task(http.post("/v1/completions", json=GREEDY))
        await until(lambda: engine.waiting == 1)  # keep accepts and queues new ones, even 0.33
        await asyncio.sleep(0.05)  # the token being generated when the pause came ends
        generated = engine.generation_tokens
        # A sleep: proves no token is generated while paused, for 0.1 s (tens of the simulator's
        # steps).
        await asyncio.sleep(0.1)
        assert engine.generation_tokens == generated and not running.done()
        await http.post("/resume")
        assert (await running).json()["choices"][0]["finish_reason"] == "length"
        assert (await queued).status_code == 200


async def test_a_pause_mode_the_release_does_not_know_is_refused_as_vllm_does() -> None:
    async with serving() as (_, http):
        answer = await http.post("/pause", params={"mode": "later"})
        # vLLM's validation handler: 400, never FastAPI's 422.
        assert answer.status_code == 400 and answer.json()["error"]["param"] == "query.mode"
    async with serving(vllm_version="0.14.0") as (engine, http):
        # 0.12 to 0.15 know no mode: only wait_for_inflight_requests.
        answer = await http.post("/pause", params={"wait_for_inflight_requests": "true"})
        assert answer.status_code == 200 and engine.user_paused


# --- /weight_checker -----------------------------------------------------------------------------


async def test_checksums_name_every_tensor_on_every_rank() -> None:
    async with serving(tensor_parallel_size=2, pipeline_parallel_size=2, num_layers=4) as (_, http):
        found = await checksums(http)
        names = tensors(4)
        assert len(found) == len(names) * 2  # each stage a part, each tensor rank all of it
        assert f"dp0:pp0:pcp0:tp1:{names[0]}" in found  # the embedding, on the first stage
        assert f"dp0:pp1:pcp0:tp0:{names[-1]}" in found  # lm_head, on the last
        assert "dp0:pp1:pcp0:tp0:model.layers.3.mlp.down_proj.weight" in found
        assert "dp0:pp0:pcp0:tp0:model.layers.3.mlp.down_proj.weight" not in found
        assert all(len(digest) == 64 for digest in found.values())
        assert await checksums(http) == found  # the same weights, the same digests


async def test_compare_as_vllm_answers_it() -> None:
    async with serving() as (_, http):
        baseline = await checksums(http)
        missing = await http.post("/weight_checker", json={"action": "compare"})
        assert missing.status_code == 400  # an HTTPException, through vLLM's handler
        assert missing.json()["error"] == {
            "message": "action='compare' requires a 'baseline' object",
            "type": "Bad Request",
            "param": None,
            "code": 400,
        }
        same = await http.post("/weight_checker", json={"action": "compare", "baseline": baseline})
        assert same.json() == {"match": True, "mismatches": []}
        unknown = await http.post("/weight_checker", json={"action": "verify"})
        assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "body.action"


@pytest.mark.parametrize("level", [1, 2])
async def test_a_good_wake_keeps_digests_and_answers(level: int) -> None:
    async with serving() as (_, http):
        before_sums, before_tokens = await checksums(http), await tokens(http)
        await sleep_and_wake(http, level)
        assert await checksums(http) == before_sums
        assert await tokens(http) == before_tokens


async def test_a_wake_with_wrong_weights_changes_one_digest_and_not_a_short_answer() -> None:
    async with serving(wake_corrupts_weights=True) as (engine, http):
        baseline, before = await checksums(http), await tokens(http)
        await sleep_and_wake(http)
        compared = await http.post(
            "/weight_checker", json={"action": "compare", "baseline": baseline}
        )
        assert compared.json() == {"match": False, "mismatches": [f"dp0:pp0:pcp0:tp0:{CORRUPTED}"]}
        assert await tokens(http) == before and not engine.weights_valid


async def test_both_failures_at_once() -> None:
    async with serving(wake_corrupts_weights=True, wake_changes_output=True) as (_, http):
        baseline, before = await checksums(http), await tokens(http)
        await sleep_and_wake(http)
        assert await checksums(http) != baseline and await tokens(http) != before


async def test_a_wake_that_changes_answers_keeps_the_digests() -> None:
    async with serving(wake_changes_output=True) as (_, http):
        baseline, before = await checksums(http), await tokens(http)
        await sleep_and_wake(http)
        assert await checksums(http) == baseline
        after = await tokens(http)
        assert after != before and await tokens(http) == after  # wrong, and steadily so


async def test_a_level_2_wake_without_reload_differs_everywhere() -> None:
    async with serving() as (_, http):
        baseline = await checksums(http)
        await http.post("/sleep", params={"level": 2})
        await http.post("/wake_up")
        after = await checksums(http)
        assert all(after[key] != digest for key, digest in baseline.items())


async def test_reset_zeroes_the_weights() -> None:
    async with serving() as (engine, http):
        before = await tokens(http)
        assert (await http.post("/weight_checker", json={"action": "reset"})).json() == {
            "status": "reset"
        }
        assert await tokens(http) != before and not engine.weights_valid


# --- greedy answers -----------------------------------------------------------------------------


async def test_a_greedy_answer_is_the_same_each_time_and_depends_on_the_prompt() -> None:
    async with serving() as (_, http):
        first, second = await tokens(http), await tokens(http)
        assert first == second and len(first) == GREEDY["max_tokens"]
        chat = await http.post(
            "/v1/chat/completions",
            json={
                "model": "m",
                "messages": [{"role": "user", "content": "count: one, two,"}],
                "max_tokens": 6,
                "return_token_ids": True,
            },
        )
        assert chat.json()["choices"][0]["token_ids"] == first  # the same words in
        other = await http.post(
            "/v1/completions", json={**GREEDY, "prompt": "else", "return_token_ids": True}
        )
        assert other.json()["choices"][0]["token_ids"] != first


async def test_a_nondeterministic_model_varies_its_last_token() -> None:
    async with serving(nondeterministic=True) as (_, http):
        answers = [await tokens(http) for _ in range(3)]
        assert len({tuple(a[:-1]) for a in answers}) == 1
        assert len({a[-1] for a in answers}) > 1


async def test_token_ids_only_from_0_10_2() -> None:
    async with serving(vllm_version="0.10.1") as (_, http):
        answer = await http.post("/v1/completions", json={**GREEDY, "return_token_ids": True})
        assert "token_ids" not in answer.json()["choices"][0]


# --- vllm#45520 -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "tp", "mode", "dies"),
    [
        ("0.24.0", 2, "abort", True),
        ("0.24.0", 2, "wait", False),  # 0.17+ wait for the requests before unmapping
        ("0.24.0", 1, "abort", False),
        ("0.25.0", 2, "abort", False),  # 0.25+ synchronize the device before unmapping
        ("0.16.0", 2, "wait", True),  # before 0.17 /sleep ignores its mode
    ],
)
async def test_a_sleep_with_requests_in_flight_kills_a_parallel_engine_before_0_25(
    version: str, tp: int, mode: str, dies: bool
) -> None:
    async with serving(vllm_version=version, tensor_parallel_size=tp, token_seconds=0.05) as (
        engine,
        http,
    ):
        running = asyncio.create_task(
            http.post("/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 6})
        )
        await until(lambda: engine.running == 1)
        slept = await http.post("/sleep", params={"level": 1, "mode": mode})
        assert slept.status_code == 200  # the answer says nothing of the crash
        await asyncio.gather(running, return_exceptions=True)
        if dies:
            await until(lambda: engine.dead)
            assert engine.crashed
            with pytest.raises(httpx.TransportError):  # refused, or a kept connection cut
                await http.get("/health")
        else:
            assert not engine.crashed
            assert (await http.get("/is_sleeping")).json() == {"is_sleeping": True}
