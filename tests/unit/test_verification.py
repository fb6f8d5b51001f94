"""The operator's records before an engine's sleeps (operator/model/verification.py), against
engines that answer over real HTTP: a check that failed for a reason the same run will give again is
not asked at every sleep, one that may pass is."""

from __future__ import annotations

import collections
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from aiohttp import web

from snooze.engine.http import EngineHttp
from snooze.operator.memory import EngineMemory
from snooze.operator.metrics import OperatorMetrics
from snooze.operator.model.verification import Verifier
from snooze.policy.integrity import Check
from snooze.policy.runs import Process

from .test_engine_verify import Route, stub

GREEDY = {"choices": [{"text": "one", "token_ids": [1, 2, 3, 4]}]}
RUN = Process("uid-1", 0)
GREEDY_BODY = json.dumps(GREEDY)


Answer = tuple[int, str]


@asynccontextmanager
async def engine(
    checker: Answer, greedy: Answer = (200, GREEDY_BODY)
) -> AsyncIterator[tuple[str, collections.Counter[str]]]:
    """An engine that answers the greedy request with `greedy`, /weight_checker with
    `checker` (each a status and a body), and counts what it was asked."""
    seen: collections.Counter[str] = collections.Counter()

    def answering(answer: Answer) -> Route:
        async def route(request: web.Request) -> web.Response:
            seen[request.path] += 1
            status, body = answer
            return web.Response(status=status, text=body, content_type="application/json")

        return route

    async def counted(request: web.Request) -> web.Response:
        seen[request.path] += 1
        return web.json_response({"detail": "Not Found"}, status=404)

    routes = {"/v1/completions": answering(greedy), "/weight_checker": answering(checker)}
    async with stub({**routes, "/version": counted}) as url:
        yield url, seen


@pytest.mark.parametrize(
    ("status", "body", "asked_again"),
    [
        (401, '{"error": "Unauthorized"}', False),  # an API key the operator does not have
        (200, '{"checksums": ["not", "a", "map"]}', False),  # an answer it cannot read
        (503, '{"error": {"message": "busy"}}', True),  # may pass
    ],
)
async def test_a_lasting_failure_is_not_asked_at_every_sleep(
    status: int, body: str, asked_again: bool
) -> None:
    async with engine((status, body)) as (url, seen), EngineHttp() as http:
        verifier = Verifier(http=http, metrics=OperatorMetrics(), namespace="ns", model="m")
        memory = EngineMemory(last_activity=0.0)
        for _ in range(3):  # three sleeps of the same run of the engine
            await verifier.record(url, "m", memory, RUN)
        integrity = memory.integrity
        assert integrity.output is Check.RECORDED and integrity.weights is Check.UNAVAILABLE
        assert seen["/weight_checker"] == (3 if asked_again else 1)
        assert ("not asked again" in integrity.message) is not asked_again
        # A new run of the engine (its container restarted) is asked afresh.
        await verifier.record(url, "m", memory, Process("uid-1", 1))
        assert seen["/weight_checker"] == (4 if asked_again else 2)


@pytest.mark.parametrize(
    ("greedy", "asks"),
    [
        ((401, '{"error": "Unauthorized"}'), 1),  # an API key the operator does not have
        # vLLM's own 404 for a model name it does not serve: the spec's modelName may be mended.
        ((404, '{"error": {"message": "The model `x` does not exist.", "code": 404}}'), 3),
    ],
)
async def test_an_output_check_refused_lastingly_is_not_asked_again(
    greedy: Answer, asks: int
) -> None:
    async with engine((404, "{}"), greedy) as (url, seen), EngineHttp() as http:
        verifier = Verifier(http=http, metrics=OperatorMetrics(), namespace="ns", model="m")
        memory = EngineMemory(last_activity=0.0)
        for _ in range(3):
            await verifier.record(url, "m", memory, RUN, weights=False)
        assert memory.integrity.output is Check.UNAVAILABLE
        assert seen["/v1/completions"] == asks


async def test_every_engines_release_is_asked_once_and_a_failure_backs_off() -> None:
    from snooze.operator.model.knownbugs import learn_versions
    from snooze.policy.knownbugs import ServeFacts

    async with (
        engine((404, "{}")) as (without, seen_without),
        EngineHttp() as http,
    ):
        memory = EngineMemory(last_activity=0.0)
        for _ in range(3):  # three cycles: one ask, then a backoff of 10 s at least
            await learn_versions(http, [(without, memory, RUN, ServeFacts())])
        assert seen_without["/version"] == 1 and memory.version is None
        assert memory.version_failures == 1 and memory.version_retry_at > 0
