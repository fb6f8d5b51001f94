"""The requests that check a woken engine (engine/verify.py), against simulated engines of
several releases and against hostile engines that answer what they like."""

from __future__ import annotations

import dataclasses
import itertools
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import web

from snooze.engine.errors import EngineHTTPError, EngineTimeoutError
from snooze.engine.http import EngineHttp
from snooze.engine.verify import (
    CHAT,
    COMPLETIONS,
    MAX_TOKENS,
    NoGenerationRoute,
    digest,
    greedy,
    version,
    weight_checksums,
)
from snooze.sim import EngineConfig, serve_engines
from snooze.sim.outputs import tensors

_hosts = (f"127.79.{i // 250}.{i % 250 + 1}" for i in itertools.count())
FAST = EngineConfig(model="m", port=0, token_seconds=0.0, checksum_seconds_per_gib=0.0)
Route = Callable[[web.Request], Awaitable[web.StreamResponse]]


@pytest.fixture
async def http() -> AsyncIterator[EngineHttp]:
    async with EngineHttp() as client:
        yield client


@asynccontextmanager
async def sim(**changes: Any) -> AsyncIterator[str]:
    config = dataclasses.replace(FAST, host=next(_hosts), **changes)
    async with serve_engines([config]) as [engine]:
        yield engine.url


@asynccontextmanager
async def stub(routes: dict[str, Route]) -> AsyncIterator[str]:
    """An engine that answers what the test says (FastAPI's 404 elsewhere)."""

    async def not_found(request: web.Request) -> web.Response:
        return web.json_response({"detail": "Not Found"}, status=404)

    app = web.Application()
    for path, handler in routes.items():
        app.router.add_route("*", path, handler)
    app.router.add_route("*", "/{tail:.*}", not_found)
    runner = web.AppRunner(app)
    await runner.setup()
    host = next(_hosts)
    site = web.TCPSite(runner, host, 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


def json_route(body: Any, status: int = 200) -> Route:
    async def handler(request: web.Request) -> web.Response:
        return web.json_response(body, status=status)

    return handler


async def test_a_greedy_answer_is_the_same_each_time_with_its_token_ids(http: EngineHttp) -> None:
    async with sim() as url:
        first = await greedy(http, url, "m", route=None, timeout=5)
        second = await greedy(http, url, "m", route=first.route, timeout=5)
    assert first == second and first.route == COMPLETIONS
    assert first.tokens is not None and len(first.tokens) == MAX_TOKENS


async def test_a_release_without_token_ids_is_compared_by_text(http: EngineHttp) -> None:
    async with sim(vllm_version="0.10.1") as url:
        answer = await greedy(http, url, "m", route=None, timeout=5)
    assert answer.tokens is None and answer.text


async def test_a_model_without_completions_is_asked_on_the_chat_route(http: EngineHttp) -> None:
    chat = {"choices": [{"message": {"content": "four"}, "token_ids": [4]}]}
    async with stub({CHAT: json_route(chat)}) as url:
        answer = await greedy(http, url, "m", route=None, timeout=5)
    assert (answer.route, answer.tokens, answer.text) == (CHAT, (4,), "four")


async def test_a_model_that_generates_nothing_says_so(http: EngineHttp) -> None:
    async with stub({}) as url:
        with pytest.raises(NoGenerationRoute):
            await greedy(http, url, "m", route=None, timeout=5)


async def test_a_wrong_model_name_is_an_error_not_a_missing_route(http: EngineHttp) -> None:
    async with sim() as url:
        with pytest.raises(EngineHTTPError) as caught:
            await greedy(http, url, "not-served", route=None, timeout=5)
    assert not isinstance(caught.value, NoGenerationRoute)
    assert caught.value.status == 404 and "does not exist" in caught.value.message


@pytest.mark.parametrize(
    "choice",
    [
        {"text": "x", "token_ids": list(range(65))},  # more ids than any check asks for
        {"text": "x", "token_ids": ["1", "2"]},
        {"text": "x", "token_ids": [True, False]},
    ],
)
async def test_an_engine_that_answers_nonsense_is_not_believed(
    http: EngineHttp, choice: dict[str, Any]
) -> None:
    async with stub({COMPLETIONS: json_route({"choices": [choice]})}) as url:
        with pytest.raises(EngineHTTPError):
            await greedy(http, url, "m", route=None, timeout=5)


async def test_weight_checksums_from_0_32_and_none_before(http: EngineHttp) -> None:
    async with sim(tensor_parallel_size=2) as url:
        sums = await weight_checksums(http, url, timeout=5)
        again = await weight_checksums(http, url, timeout=5)
    assert sums is not None and len(sums) == 2 * len(tensors(32))  # a Llama-3-8B's
    assert digest(sums) == digest(dict(reversed(list(sums.items())))) == digest(again or {})
    async with sim(vllm_version="0.31.0") as url:
        assert await weight_checksums(http, url, timeout=5) is None


async def test_hostile_checksums_are_not_believed(http: EngineHttp) -> None:
    for body in ({"checksums": {"a": "x" * 500}}, {"checksums": ["a"]}, {"no": 1}):
        async with stub({"/weight_checker": json_route(body)}) as url:
            with pytest.raises(EngineHTTPError):
                await weight_checksums(http, url, timeout=5)


async def test_a_checksum_that_takes_too_long_times_out(http: EngineHttp) -> None:
    async with sim(checksum_seconds_per_gib=1.0, gpu_memory_gib=2.0) as url:
        with pytest.raises(EngineTimeoutError):
            await weight_checksums(http, url, timeout=0.2)


async def test_the_release_is_read_from_version(http: EngineHttp) -> None:
    async with sim(vllm_version="0.24.0") as url:
        assert await version(http, url, timeout=5) == "0.24.0"
    async with stub({"/version": json_route({"version": "v" * 100})}) as url:
        with pytest.raises(EngineHTTPError):
            await version(http, url, timeout=5)


@pytest.mark.parametrize(("layers", "tp"), [(32, 4), (80, 8)])  # 8B at TP4: 98 kB; 70B at TP8
async def test_the_checksums_of_a_real_model_are_read_whole(
    http: EngineHttp, layers: int, tp: int
) -> None:
    async with sim(num_layers=layers, tensor_parallel_size=tp) as url:
        sums = await weight_checksums(http, url, timeout=5)
    assert sums is not None and len(sums) == len(tensors(layers)) * tp


async def test_a_large_answer_is_parsed_off_the_event_loop(
    http: EngineHttp, monkeypatch: pytest.MonkeyPatch
) -> None:
    from snooze.engine import verify

    threads: list[int] = []
    parse = verify._checksums

    def spied(body: bytes) -> dict[str, str] | str:
        threads.append(threading.get_ident())
        return parse(body)

    monkeypatch.setattr(verify, "_checksums", spied)
    async with sim(num_layers=80, tensor_parallel_size=8) as url:
        await weight_checksums(http, url, timeout=5)
    assert threads and threading.get_ident() not in threads
    async with sim(num_layers=2) as url:  # a small answer is not worth a thread
        await weight_checksums(http, url, timeout=5)
    assert threads[-1] == threading.get_ident()


async def test_an_answer_larger_than_any_model_is_refused_unread(http: EngineHttp) -> None:
    from snooze.engine.errors import AnswerTooLargeError
    from snooze.engine.verify import CHECKSUMS_LIMIT

    async def huge(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Length": str(CHECKSUMS_LIMIT + 1)})
        await response.prepare(request)
        await response.write(b'{"checksums": {')
        return response

    async with stub({"/weight_checker": huge}) as url:
        with pytest.raises(AnswerTooLargeError):
            await weight_checksums(http, url, timeout=5)


async def test_an_unknown_model_is_an_error_not_a_missing_route_on_every_release(
    http: EngineHttp,
) -> None:
    # vLLM's own 404 was a flat ErrorResponse before 0.10.1, nested in "error" from it; only
    # FastAPI's {"detail": "Not Found"} says the route is missing.
    for release in ("0.8.5", "0.10.0", "0.10.1", "0.33.0"):
        async with sim(vllm_version=release) as url:
            with pytest.raises(EngineHTTPError) as caught:
                await greedy(http, url, "not-this-model", route=None, timeout=5)
        assert not isinstance(caught.value, NoGenerationRoute), release
        assert caught.value.status == 404 and "does not exist" in caught.value.message
