"""The engine client against fake engines: classification, answers old and new, metrics scrapes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from snooze.engine import http as http_module
from snooze.engine.activity import PROBE_METRICS
from snooze.engine.client import (
    ActivitySnapshot,
    EngineClient,
    SleepState,
    parse_activity,
)
from snooze.engine.errors import (
    MESSAGE_LIMIT,
    EngineError,
    EngineHTTPError,
    EngineTimeoutError,
    EngineUnreachableError,
    HybridKVCacheReinitError,
    SleepModeDisabledError,
    classify_answer,
    error_message,
)
from snooze.engine.http import Answer, EngineHttp, Params

URL = "http://10.0.0.7:8000"
HYBRID_JSON = json.dumps(
    {
        "error": {
            "message": "AttributeError: 'list' object has no attribute 'zero_'",
            "type": "InternalServerError",
            "code": 500,
        }
    }
)
HYBRID_TEXT = (
    "Traceback (most recent call last):\n  File gpu_model_runner.py, in init_fp8_kv_scales\n"
    "    kv_cache.zero_()\nAttributeError: 'list' object has no attribute 'zero_'\n"
)

Handler = Callable[[httpx.Request], Awaitable[httpx.Response]]


class FakeHttp(EngineHttp):
    """The engine client's session, answered by a FakeEngine instead of the network (the
    session's own handling of sockets is tested against real ones below)."""

    def __init__(self, engine: FakeEngine) -> None:
        super().__init__()
        self.engine = engine
        self.closed = False

    async def request(
        self,
        method: str,
        url: str,
        *,
        total: float,
        connect: float,
        params: Params = None,
        json: Any = None,
        urgent: bool = False,
        limit: int = http_module.ANSWER_LIMIT,
        sink: http_module.Sink | None = None,
    ) -> Answer:
        request = httpx.Request(method, url, params=params, json=json)
        async with asyncio.timeout(total):
            response = await self.engine(request)
        if sink is not None and response.is_success:
            sink(response.content)
            return Answer(response.status_code, b"")
        return Answer(response.status_code, response.content)

    async def aclose(self) -> None:
        self.closed = True


class FakeEngine:
    """Answers from a table of (method, path) -> response and records every request."""

    def __init__(self, answers: dict[tuple[str, str], httpx.Response | Handler]) -> None:
        self.answers = answers
        self.requests: list[httpx.Request] = []

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers.get((request.method, request.url.path))
        if answer is None:
            return httpx.Response(404, json={"detail": "Not Found"})
        if isinstance(answer, httpx.Response):
            return answer
        return await answer(request)

    def client(self, *, timeout: float = 5.0) -> EngineClient:
        client = EngineClient(URL, timeout=timeout)
        client._client = FakeHttp(self)
        return client

    def calls(self) -> list[str]:
        return [
            f"{r.method} {r.url.path}" + (f"?{r.url.query.decode()}" if r.url.query else "")
            for r in self.requests
        ]


def slow(seconds: float) -> Handler:
    async def handler(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(seconds)
        return httpx.Response(200)

    return handler


# --- classification: pure -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "body", "path", "expected", "reason"),
    [
        (500, HYBRID_JSON, "/wake_up", HybridKVCacheReinitError, "HybridKVCacheReinit"),
        (500, HYBRID_TEXT, "/wake_up", HybridKVCacheReinitError, "HybridKVCacheReinit"),
        (500, "error in init_fp8_kv_scales", "/wake_up", HybridKVCacheReinitError, None),
        (500, "Internal Server Error", "/wake_up", EngineHTTPError, "EngineError"),
        (404, '{"detail":"Not Found"}', "/sleep", SleepModeDisabledError, "SleepModeDisabled"),
        (404, '{"detail":"Not Found"}', "/wake_up", SleepModeDisabledError, None),
        (404, '{"detail":"Not Found"}', "/is_sleeping", SleepModeDisabledError, None),
        (404, '{"detail":"Not Found"}', "/collective_rpc", SleepModeDisabledError, None),
        (404, '{"detail":"Not Found"}', "/metrics", EngineHTTPError, "EngineError"),
        (500, "AssertionError: Sleep mode is not enabled", "/sleep", SleepModeDisabledError, None),
        (400, '{"error":{"message":"bad level"}}', "/sleep", EngineHTTPError, None),
        (503, "", "/collective_rpc", EngineHTTPError, None),
    ],
)
def test_classify_answer(
    status: int, body: str, path: str, expected: type[EngineHTTPError], reason: str | None
) -> None:
    error = classify_answer(status, body, url=URL + path, path=path)
    assert type(error) is expected
    assert error.status == status
    assert error.url == URL + path
    if reason is not None:
        assert error.reason == reason


def test_error_messages_say_what_to_do() -> None:
    hybrid = classify_answer(500, HYBRID_JSON, url=URL, path="/wake_up")
    assert "'list' object has no attribute 'zero_'" in hybrid.message
    assert "images/vllm" in str(hybrid) and "0.27.0" in str(hybrid) and "Restart" in str(hybrid)
    disabled = classify_answer(404, "", url=URL, path="/sleep")
    assert "--enable-sleep-mode" in str(disabled) and "VLLM_SERVER_DEV_MODE=1" in str(disabled)
    rpc = classify_answer(404, "", url=URL, path="/collective_rpc")
    assert "0.10.2" in str(rpc)
    # A bare 500 on wake may be the hybrid bug of vLLM 0.12-0.17, which hides its message.
    bare = classify_answer(500, "Internal Server Error", url=URL, path="/wake_up")
    assert "#41564" in str(bare)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('{"error": {"message": "boom", "type": "X", "code": 500}}', "boom"),
        ('{"object": "error", "message": "flat boom", "code": 400}', "flat boom"),
        ('{"detail": "Not Found"}', "Not Found"),
        ('{"error": "just a string"}', "just a string"),
        ("Internal Server Error", "Internal Server Error"),
        ("  line one\n\n  line two  ", "line one line two"),
        ("", "(empty body)"),
        ("[1, 2]", "[1, 2]"),
    ],
)
def test_error_message_extraction(body: str, message: str) -> None:
    assert error_message(body) == message


def test_error_message_is_truncated() -> None:
    message = error_message(json.dumps({"error": {"message": "x" * 5000}}))
    assert len(message) == MESSAGE_LIMIT
    assert message.endswith("…")


def test_exception_tree() -> None:
    reasons = {
        EngineError: "EngineError",
        EngineUnreachableError: "Unreachable",
        EngineTimeoutError: "Timeout",
        EngineHTTPError: "EngineError",
        HybridKVCacheReinitError: "HybridKVCacheReinit",
        SleepModeDisabledError: "SleepModeDisabled",
    }
    for cls, reason in reasons.items():
        assert issubclass(cls, EngineError)
        assert cls.reason == reason
    assert issubclass(HybridKVCacheReinitError, EngineHTTPError)
    assert issubclass(SleepModeDisabledError, EngineHTTPError)


# --- sleep and wake ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "answer",
    [httpx.Response(200), httpx.Response(200, json={"status": "sleeping", "level": 1})],
    ids=["empty-body (<=0.31)", "json (0.32+)"],
)
async def test_sleep_sends_level_and_mode(answer: httpx.Response) -> None:
    engine = FakeEngine({("POST", "/sleep"): answer})
    async with engine.client() as client:
        await client.sleep(1)
        await client.sleep(2, "abort")
    assert engine.calls() == ["POST /sleep?level=1&mode=wait", "POST /sleep?level=2&mode=abort"]


async def test_sleep_refuses_bad_arguments() -> None:
    async with FakeEngine({}).client() as client:
        with pytest.raises(ValueError, match="level"):
            await client.sleep(3)
        with pytest.raises(ValueError, match="mode"):
            await client.sleep(1, "nap")


async def test_wake_level_1_with_json_answer_needs_no_probe() -> None:
    engine = FakeEngine(
        {("POST", "/wake_up"): httpx.Response(200, json={"status": "awake", "tags": []})}
    )
    async with engine.client() as client:
        await client.wake(1)
    assert engine.calls() == ["POST /wake_up"]


async def test_wake_level_1_with_empty_answer_checks_is_sleeping() -> None:
    engine = FakeEngine(
        {
            ("POST", "/wake_up"): httpx.Response(200),
            ("GET", "/is_sleeping"): httpx.Response(200, json={"is_sleeping": False}),
        }
    )
    async with engine.client() as client:
        await client.wake(1)
    assert engine.calls() == ["POST /wake_up", "GET /is_sleeping"]


@pytest.mark.parametrize(
    "answers",
    [
        {("POST", "/wake_up"): httpx.Response(200, json={"status": "sleeping", "tags": []})},
        {
            ("POST", "/wake_up"): httpx.Response(200),
            ("GET", "/is_sleeping"): httpx.Response(200, json={"is_sleeping": True}),
        },
    ],
    ids=["json", "empty-body"],
)
async def test_wake_that_leaves_the_engine_asleep_raises(
    answers: dict[tuple[str, str], httpx.Response | Handler],
) -> None:
    async with FakeEngine(answers).client() as client:
        with pytest.raises(EngineHTTPError, match="still sleeps"):
            await client.wake(1)


async def test_wake_level_1_staged() -> None:
    engine = FakeEngine(
        {("POST", "/wake_up"): httpx.Response(200, json={"status": "awake", "tags": []})}
    )
    async with engine.client() as client:
        await client.wake(1, staged=True)
    assert engine.calls() == ["POST /wake_up?tags=weights", "POST /wake_up?tags=kv_cache"]


async def test_wake_level_2_reloads_weights_between_the_two_wakes() -> None:
    engine = FakeEngine(
        {
            ("POST", "/wake_up"): httpx.Response(200),
            ("POST", "/collective_rpc"): httpx.Response(200, json={"results": [None]}),
            ("GET", "/is_sleeping"): httpx.Response(200, json={"is_sleeping": False}),
        }
    )
    async with engine.client() as client:
        await client.wake(2)
    assert engine.calls() == [
        "POST /wake_up?tags=weights",
        "POST /collective_rpc",
        "POST /wake_up?tags=kv_cache",
        "GET /is_sleeping",
    ]
    assert json.loads(engine.requests[1].content) == {"method": "reload_weights"}


async def test_wake_reports_each_step_and_skips_those_done() -> None:
    answers: dict[tuple[str, str], httpx.Response | Handler] = {
        ("POST", "/wake_up"): httpx.Response(200),
        ("POST", "/collective_rpc"): httpx.Response(200, json={"results": [None]}),
        ("GET", "/is_sleeping"): httpx.Response(200, json={"is_sleeping": False}),
    }
    engine = FakeEngine(answers)
    steps: list[str] = []

    async def record(step: str) -> None:
        steps.append(step)

    async with engine.client() as client:
        await client.wake(2, on_step=record)
    assert steps == ["weights", "reload_weights", "kv_cache"]

    # Resumed after the weights and their reload: only the KV cache is left to wake.
    resumed = FakeEngine(answers)
    async with resumed.client() as client:
        await client.wake(2, done={"weights", "reload_weights"})
    assert resumed.calls() == ["POST /wake_up?tags=kv_cache", "GET /is_sleeping"]

    # The last step always runs: its answer is what says the engine is awake.
    again = FakeEngine(answers)
    async with again.client() as client:
        await client.wake(2, done={"weights", "reload_weights", "kv_cache"})
    assert again.calls() == ["POST /wake_up?tags=kv_cache", "GET /is_sleeping"]


@pytest.mark.parametrize("body", [HYBRID_JSON, HYBRID_TEXT], ids=["json (0.18+)", "plain text"])
async def test_wake_recognises_the_hybrid_crash(body: str) -> None:
    engine = FakeEngine({("POST", "/wake_up"): httpx.Response(500, text=body)})
    async with engine.client() as client:
        with pytest.raises(HybridKVCacheReinitError) as caught:
            await client.wake(1)
    assert caught.value.reason == "HybridKVCacheReinit"
    assert caught.value.status == 500


async def test_wake_timeout_covers_the_whole_sequence() -> None:
    engine = FakeEngine(
        {
            ("POST", "/wake_up"): slow(0.03),
            ("POST", "/collective_rpc"): slow(5),
        }
    )
    async with engine.client() as client:
        # The first step takes a fraction of the bound, so that it ends within it even on a
        # loaded machine; the second would take many times the bound.
        with pytest.raises(EngineTimeoutError, match=r"0\.5s waking up from level 2") as caught:
            await client.wake(2, timeout=0.5)
    assert caught.value.reason == "Timeout"
    assert engine.calls() == ["POST /wake_up?tags=weights", "POST /collective_rpc"]


# --- transport failures -----------------------------------------------------------------------


async def serve_raw(reply: Callable[[asyncio.StreamWriter], Awaitable[None]]) -> asyncio.Server:
    """A loopback server that reads a request's head and answers with `reply`."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await reply(writer)

    return await asyncio.start_server(handle, "127.0.0.1", 0)


def url_of(server: asyncio.Server) -> str:
    return f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def awake(writer: asyncio.StreamWriter) -> None:
    body = b'{"is_sleeping": false}'
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    await writer.drain()
    writer.close()


async def test_a_refused_connection_is_unreachable() -> None:
    server = await serve_raw(awake)
    url = url_of(server)
    server.close()
    await server.wait_closed()  # nothing listens there any more
    async with EngineClient(url, timeout=2) as client:
        with pytest.raises(EngineUnreachableError, match="cannot connect") as caught:
            await client.is_sleeping()
    assert caught.value.url == url + "/is_sleeping"


async def test_an_answer_cut_short_is_unreachable() -> None:
    async def half(writer: asyncio.StreamWriter) -> None:
        writer.write(b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"is_sl')
        await writer.drain()
        writer.transport.abort()  # the engine died mid-answer

    async with await serve_raw(half) as server, EngineClient(url_of(server)) as client:
        with pytest.raises(EngineUnreachableError, match="broke before a whole answer"):
            await client.is_sleeping()


async def test_a_silent_engine_times_out() -> None:
    async def silent(writer: asyncio.StreamWriter) -> None:
        # The stand-in's silence, not a wait: it never answers within the client's timeout.
        await asyncio.sleep(30)

    async with (
        await serve_raw(silent) as server,
        EngineClient(url_of(server), timeout=0.2) as client,
    ):
        with pytest.raises(EngineTimeoutError, match=r"longer than 0\.2s"):
            await client.is_sleeping()
        with pytest.raises(EngineTimeoutError, match=r"longer than 0\.3s"):
            await client.sleep(1, timeout=0.3)


async def test_every_call_has_a_deadline() -> None:
    engine = FakeEngine({("GET", "/metrics/"): slow(5), ("GET", "/health"): slow(5)})
    async with engine.client(timeout=0.05) as client:
        with pytest.raises(EngineTimeoutError):
            await client.activity()
        with pytest.raises(EngineTimeoutError):
            await client.health()


# --- health and is_sleeping -------------------------------------------------------------------


@pytest.mark.parametrize(("status", "healthy"), [(200, True), (503, False), (500, False)])
async def test_health(status: int, healthy: bool) -> None:
    async with FakeEngine({("GET", "/health"): httpx.Response(status)}).client() as client:
        assert await client.health() is healthy


async def test_health_of_something_else_raises() -> None:
    async with FakeEngine({}).client() as client:
        with pytest.raises(EngineHTTPError):
            await client.health()


@pytest.mark.parametrize("value", [True, False])
async def test_is_sleeping(value: bool) -> None:
    answer = httpx.Response(200, json={"is_sleeping": value})
    async with FakeEngine({("GET", "/is_sleeping"): answer}).client() as client:
        assert await client.is_sleeping() is value


@pytest.mark.parametrize("body", ["<html>", "[]", '{"is_sleeping": "yes"}', ""])
async def test_is_sleeping_unreadable(body: str) -> None:
    answer = httpx.Response(200, text=body)
    async with FakeEngine({("GET", "/is_sleeping"): answer}).client() as client:
        with pytest.raises(EngineHTTPError, match="cannot read"):
            await client.is_sleeping()


async def test_is_sleeping_without_dev_mode() -> None:
    async with FakeEngine({}).client() as client:
        with pytest.raises(SleepModeDisabledError):
            await client.is_sleeping()


# --- activity ---------------------------------------------------------------------------------

PAYLOAD = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 4.0
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 10.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 5.0
vllm:request_success_total{engine="0",finished_reason="abort",model_name="m"} 1.0
# HELP vllm:engine_sleep_state Engine sleep state
# TYPE vllm:engine_sleep_state gauge
vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="awake"} 0.0
vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="weights_offloaded"} 1.0
vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="discard_all"} 0.0
"""


def test_parse_activity() -> None:
    assert parse_activity(PAYLOAD) == ActivitySnapshot(
        running=3, waiting=4, success_total=16.0, sleep_state=SleepState.WEIGHTS_OFFLOADED
    )
    assert parse_activity(PAYLOAD).in_flight == 7  # type: ignore[union-attr]


def test_parse_activity_without_sleep_state_or_success() -> None:
    text = "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"
    assert parse_activity(text) == ActivitySnapshot(0, 0, 0.0, None)


def test_parse_activity_deepest_sleep_state_wins() -> None:
    text = (
        'vllm:num_requests_running{engine="0"} 0\n'
        'vllm:engine_sleep_state{engine="0",sleep_state="awake"} 1\n'
        'vllm:engine_sleep_state{engine="1",sleep_state="discard_all"} 1\n'
        'vllm:engine_sleep_state{engine="1",sleep_state="dreaming"} 1\n'
    )
    snapshot = parse_activity(text)
    assert snapshot is not None and snapshot.sleep_state is SleepState.DISCARD_ALL


def test_parse_activity_without_gauges_is_none() -> None:
    assert parse_activity("") is None
    assert parse_activity("process_cpu_seconds_total 3\n") is None


async def test_activity_asks_for_the_filtered_families() -> None:
    engine = FakeEngine({("GET", "/metrics/"): httpx.Response(200, text=PAYLOAD)})
    async with engine.client() as client:
        snapshot = await client.activity()
    assert snapshot.success_total == 16.0
    # Not the engine's CacheConfig (static, and costly to read): only the probe's families,
    # on the path whose filter works on every vLLM release (0.8.5+: GET /metrics ignores it).
    assert engine.requests[0].url.path == "/metrics/"
    assert engine.requests[0].url.params.get_list("name[]") == list(PROBE_METRICS)


async def test_an_engine_without_the_slash_path_is_asked_metrics_from_then_on() -> None:
    engine = FakeEngine({("GET", "/metrics"): httpx.Response(200, text=PAYLOAD)})
    async with engine.client() as client:
        assert (await client.activity()).success_total == 16.0
        assert (await client.activity()).success_total == 16.0
    assert [r.url.path for r in engine.requests] == ["/metrics/", "/metrics", "/metrics"]
    assert all(r.url.params.get_list("name[]") for r in engine.requests)


def vllm_like_registry(*, running: float, success: int) -> CollectorRegistry:
    """A registry shaped like vLLM's: the families and labels of docs/vllm-contract.md, plus a
    histogram."""
    registry = CollectorRegistry()
    labels = ["model_name", "engine"]
    Gauge("vllm:num_requests_running", "r", labels, registry=registry).labels("m", "0").set(running)
    Gauge("vllm:num_requests_waiting", "w", labels, registry=registry).labels("m", "0").set(1)
    counter = Counter("vllm:request_success", "s", [*labels, "finished_reason"], registry=registry)
    counter.labels("m", "0", "stop").inc(success)
    counter.labels("m", "0", "length").inc(1)
    state = Gauge("vllm:engine_sleep_state", "s", [*labels, "sleep_state"], registry=registry)
    for name in ("awake", "weights_offloaded", "discard_all"):
        state.labels("m", "0", name).set(1 if name == "awake" else 0)
    Histogram("vllm:e2e_request_latency_seconds", "h", labels, registry=registry).labels(
        "m", "0"
    ).observe(0.5)
    return registry


@contextlib.contextmanager
def exposition(registry: CollectorRegistry) -> Iterator[tuple[str, list[str]]]:
    """prometheus_client's own exposition app (what vLLM mounts at /metrics, with the same
    `name[]` filter) served on a loopback port; yields its URL and each request's query."""
    app = make_wsgi_app(registry=registry)
    queries: list[str] = []

    def spy(environ: dict[str, Any], start_response: Any) -> Any:
        queries.append(environ.get("QUERY_STRING", ""))
        return app(environ, start_response)

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

    server = make_server("127.0.0.1", 0, spy, handler_class=Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", queries
    finally:
        server.shutdown()
        server.server_close()


async def test_activity_against_prometheus_clients_own_app() -> None:
    # Proves the `name[]` values, as sent on the wire, are the ones vLLM's exposition filters
    # by (sample names: `vllm:request_success_total`, not the family `vllm:request_success`).
    registry = vllm_like_registry(running=2, success=7)
    with exposition(registry) as (url, queries):
        async with EngineClient(url) as client:
            assert await client.activity() == ActivitySnapshot(
                running=2, waiting=1, success_total=8.0, sleep_state=SleepState.AWAKE
            )
        assert len(queries) == 1  # the filter worked: no fallback scrape
        async with httpx.AsyncClient() as http:
            filtered = await http.get(url + "/metrics", params={"name[]": list(PROBE_METRICS)})
            assert "e2e_request_latency" not in filtered.text
            family = await http.get(url + "/metrics", params={"name[]": "vllm:request_success"})
            assert family.text == ""


class NamelessCollector:
    """Like prometheus_client's MultiProcessCollector (vLLM with several API servers): no
    `describe`, so a `name[]`-filtered scrape cannot find it."""

    def collect(self) -> list[Metric]:
        running = GaugeMetricFamily("vllm:num_requests_running", "r", labels=["model_name"])
        running.add_metric(["m"], 1)
        waiting = GaugeMetricFamily("vllm:num_requests_waiting", "w", labels=["model_name"])
        waiting.add_metric(["m"], 0)
        return [running, waiting]


async def test_activity_falls_back_once_when_the_filter_finds_nothing() -> None:
    registry = CollectorRegistry()
    registry.register(NamelessCollector())
    with exposition(registry) as (url, queries):
        async with EngineClient(url) as client:
            expected = ActivitySnapshot(running=1, waiting=0, success_total=0.0, sleep_state=None)
            assert await client.activity() == expected
            assert await client.activity() == expected
    assert [bool(q) for q in queries] == [True, False, False]  # filtered once, then whole


async def test_activity_without_any_gauge_raises() -> None:
    engine = FakeEngine({("GET", "/metrics/"): httpx.Response(200, text="up 1\n")})
    async with engine.client() as client:
        with pytest.raises(EngineHTTPError, match="num_requests_running"):
            await client.activity()
        # A payload without gauges is no proof that the filter is broken: keep filtering.
        with pytest.raises(EngineHTTPError):
            await client.activity()
    assert [bool(r.url.query) for r in engine.requests] == [True, False, True, False]


async def test_activity_not_prometheus_text() -> None:
    engine = FakeEngine({("GET", "/metrics/"): httpx.Response(200, text="{not metrics{")})
    async with engine.client() as client:
        with pytest.raises(EngineHTTPError, match="cannot read"):
            await client.activity()


# --- connection pool ownership -----------------------------------------------------------------


async def test_a_shared_session_outlives_its_engine_clients() -> None:
    answer = httpx.Response(200, json={"is_sleeping": False})
    shared = FakeHttp(FakeEngine({("GET", "/is_sleeping"): answer}))
    for host in ("http://10.0.0.1:8000", "http://10.0.0.2:8000/"):
        async with EngineClient(host, client=shared) as client:
            assert await client.is_sleeping() is False
    assert not shared.closed
    async with await serve_raw(awake) as server:
        private = EngineClient(url_of(server))
        assert await private.is_sleeping() is False
        await private.aclose()
    session = private._client._session
    assert session is not None and session.closed


# --- the operator's prober ----------------------------------------------------------------------


def test_the_fast_reader_agrees_with_prometheus_clients_parser() -> None:
    # The probe's own line reader, against the reference parser, on every family it reads
    # (a label with an escaped quote, a data-parallel engine's two label sets, NaN).
    from prometheus_client.parser import text_string_to_metric_families

    from snooze.engine.activity import ACTIVITY_METRICS
    from snooze.engine.exposition import samples

    text = (
        "# HELP vllm:num_requests_running x\n# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{model_name="a \\"b\\"",engine="0"} 2.0\n'
        'vllm:num_requests_running{model_name="a \\"b\\"",engine="1"} 1.0\n'
        'vllm:num_requests_waiting{engine="0"} NaN\n'
        'vllm:request_success_total{finished_reason="stop",engine="0"} 7.0\n'
        'vllm:engine_sleep_state{sleep_state="awake",engine="0"} 1.0\n'
        'vllm:sleep_mode_operations_in_flight{operation="sleep"} 0.0\n'
        "vllm:other 5\n"
    )
    ours = [(name, value) for name, _, value in samples(text, ACTIVITY_METRICS, series_limit=99)]
    reference = [
        (s.name, s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name != "vllm:other"
    ]
    assert len(ours) == len(reference)
    for (a, x), (b, y) in zip(ours, reference, strict=True):
        assert a == b and (x == y or (x != x and y != y))  # NaN == NaN here


@pytest.mark.parametrize(
    "text", ["vllm:num_requests_running\n", 'vllm:num_requests_running{a="b" \n']
)
def test_the_fast_reader_refuses_a_broken_line(text: str) -> None:
    from snooze.engine.activity import parse_activity

    with pytest.raises(ValueError):
        parse_activity(text)


async def test_a_steps_requests_share_a_connection_kept_shorter_than_vllms(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A sleep's drain check, sleep and confirmation reuse one connection; one kept past
    # KEEPALIVE_SECONDS is not taken again (vLLM closes an idle one after 5 s, and a request
    # sent on a connection it is closing would fail).
    monkeypatch.setattr(http_module, "KEEPALIVE_SECONDS", 0.3)
    connections = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        body = b'{"is_sleeping": true}'
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:  # HTTP/1.1 keep-alive: one answer per request, until the client leaves
                await reader.readuntil(b"\r\n\r\n")
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
        writer.close()

    async with (
        await asyncio.start_server(handle, "127.0.0.1", 0) as server,
        EngineClient(url_of(server)) as client,
    ):
        for _ in range(3):
            assert await client.is_sleeping() is True
        assert connections == 1
        # A sleep: the connection sits idle past KEEPALIVE_SECONDS (0.3 s here); the next
        # request must open a new one.
        await asyncio.sleep(0.5)
        assert await client.is_sleeping() is True
        assert connections == 2
