"""What the operator reads of an engine is bounded and checked: pages read a chunk at a time with
every line and series bounded, values no engine can have refused with their reason, answers
cut at their size and their whole time, and slow engines kept off the probes' shared slots.
Gateway replicas' pages and /idle are read the same way. The HTTP cases run against loopback
servers that write raw bytes."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from waits import until

from snooze.engine import http as http_module
from snooze.engine.activity import ActivityReader, SleepState, parse_activity
from snooze.engine.client import EngineClient, new_http_client
from snooze.engine.errors import AnswerTooLargeError, EngineTimeoutError, InvalidAnswerError
from snooze.engine.exposition import LINE_LIMIT, Labels, Page, samples
from snooze.engine.http import EngineHttp
from snooze.engine.probe import Prober
from snooze.engine.turns import Turns
from snooze.operator.metrics import OperatorMetrics
from snooze.operator.traffic.gateways import GatewayTraffic

GAUGES = "vllm:num_requests_running 1\nvllm:num_requests_waiting 2\n"
AWAKE = 'vllm:engine_sleep_state{sleep_state="awake"} 1\n'

# --- pages, a chunk at a time ------------------------------------------------------------------

PAGE = (
    "# HELP vllm:num_requests_running r\n"
    'vllm:num_requests_running{engine="0",model_name="a \\"b\\""} 2.0\n'
    'vllm:num_requests_running{engine="1",model_name="a \\"b\\""} 1.0\n'
    'vllm:num_requests_waiting{engine="0"} 4\n'
    'vllm:request_success_total{engine="0",finished_reason="stop"} 10\n'
    'vllm:engine_sleep_state{engine="0",sleep_state="weights_offloaded"} 1\n'
    'vllm:e2e_request_latency_seconds_bucket{le="+Inf"} 3\n'
)


def read_in_pieces(text: bytes, size: int) -> object:
    reader = ActivityReader()
    for at in range(0, len(text), size):
        reader.feed(text[at : at + size])
    return reader.result()


@pytest.mark.parametrize("size", [1, 2, 7, 64, 10_000])
def test_a_page_read_in_pieces_says_what_it_says_whole(size: int) -> None:
    whole = parse_activity(PAGE)
    assert whole is not None and (whole.running, whole.waiting) == (3, 4)
    assert whole.sleep_state is SleepState.WEIGHTS_OFFLOADED
    assert read_in_pieces(PAGE.encode(), size) == whole


def test_a_long_line_of_a_family_not_read_is_skipped_unread() -> None:
    long_line = 'vllm:some_info{x="' + "y" * (3 * LINE_LIMIT) + '"} 1\n'
    snapshot = read_in_pieces((long_line + GAUGES + long_line + AWAKE).encode(), 4096)
    assert snapshot == parse_activity(GAUGES + AWAKE)


@pytest.mark.parametrize("size", [4096, 10 * LINE_LIMIT])
def test_a_long_line_of_a_family_read_makes_the_page_unreadable(size: int) -> None:
    long_line = 'vllm:cache_config_info{x="' + "y" * LINE_LIMIT + '"} 1\n'
    with pytest.raises(ValueError, match="longer than 64 KiB"):
        read_in_pieces((GAUGES + long_line).encode(), size)


def test_a_series_sent_twice_is_refused() -> None:
    state = 'vllm:engine_sleep_state{a="1",sleep_state="awake"} 1\n'
    with pytest.raises(ValueError, match="twice"):
        parse_activity(GAUGES + state + state)


def test_series_beyond_the_limit_are_refused() -> None:
    wanted = ["vllm:num_requests_running"]
    lines = "".join(f'vllm:num_requests_running{{engine="{i}"}} 0\n' for i in range(11))
    assert len(samples(lines, wanted, series_limit=11)) == 11
    with pytest.raises(ValueError, match="more than 10 series"):
        samples(lines, wanted, series_limit=10)


def test_only_the_wanted_families_are_parsed() -> None:
    seen: list[str] = []
    page = Page(["vllm:num_requests_running"], lambda n, _, __: seen.append(n), series_limit=9)
    page.feed(b"\xff\xfe not text at all {{{\nvllm:num_requests_running_total 3\n")
    page.feed(b"vllm:num_requests_running 1")
    page.close()  # the last line needs no newline
    assert seen == ["vllm:num_requests_running"]


def test_a_label_is_read_as_written_wherever_it_is() -> None:
    labels = Labels(b' a = "x\\"y" , sleep_state="awake",b=""')
    assert (labels.get("a"), labels.get("sleep_state"), labels.get("b")) == ('x\\"y', "awake", "")
    assert labels.get("state") is None  # not the end of another label's name


def test_a_label_is_never_read_from_inside_another_labels_value() -> None:
    """A value holds anything its writer chose (a client's model name, a tenant's fairness id):
    `,name="` inside it is part of the value, not a label."""
    labels = Labels(b'model_name="a,target=",target="real",fake="x\\",target="no""')
    assert labels.get("target") == "real"
    assert labels.get("model_name") == "a,target="
    assert Labels(b'a=",b="x""').get("b") is None


def test_a_label_that_is_read_and_not_utf8_is_refused() -> None:
    assert read_in_pieces(GAUGES.encode() + b'vllm:x{a="\xff"} 1\n', 100) is not None
    with pytest.raises(ValueError, match="sleep_state is not UTF-8"):
        read_in_pieces(GAUGES.encode() + b'vllm:engine_sleep_state{sleep_state="\xff"} 1\n', 100)


# --- values no engine can have -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("page", "reason"),
    [
        ("vllm:num_requests_running +Inf\nvllm:num_requests_waiting 0\n", "running is +Inf"),
        ("vllm:num_requests_running -Inf\nvllm:num_requests_waiting 0\n", "running is -Inf"),
        ("vllm:num_requests_running 0\nvllm:num_requests_waiting NaN\n", "waiting is NaN"),
        ("vllm:num_requests_running -1\nvllm:num_requests_waiting 0\n", "running is -1"),
        ("vllm:num_requests_running 2e6\nvllm:num_requests_waiting 0\n", "is 2e+06"),
        (GAUGES + "vllm:request_success_total 1e20\n", "success_total is 1e+20"),
        (GAUGES + 'vllm:engine_sleep_state{sleep_state="awake"} 0.5\n', "state is 0.5"),
        (GAUGES + 'vllm:sleep_mode_operations_in_flight{operation="sleep"} NaN\n', "is NaN"),
        (
            'vllm:num_requests_running{engine="0"} 600000\n'
            'vllm:num_requests_running{engine="1"} 600000\nvllm:num_requests_waiting 0\n',
            "add up to 1.2e+06",
        ),
        ("vllm:num_requests_running 1O\n", "not a number"),
    ],
)
def test_a_value_no_engine_can_have_is_refused_with_its_reason(page: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason.replace("+", r"\+")):
        parse_activity(page)


def test_a_gpu_share_out_of_bounds_is_not_believed_but_the_probe_stands() -> None:
    for share in ("NaN", "inf", "-0.5", "1.5", "most"):
        config = f'vllm:cache_config_info{{gpu_memory_utilization="{share}"}} 1\n'
        snapshot = parse_activity(GAUGES + config)
        assert snapshot is not None and snapshot.gpu_memory_utilization is None


# --- answers bounded in size and in time -------------------------------------------------------

Reply = Callable[[asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def engine(reply: Reply) -> AsyncIterator[str]:
    """A loopback engine that answers every request with `reply`; yields its URL."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Cancelled too, when the test ends with an answer still dripping.
        with contextlib.suppress(
            ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError
        ):
            while True:
                await reader.readuntil(b"\r\n\r\n")
                await reply(writer)
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()


def chunked(block: bytes, times: int, written: list[int], *, status: bytes = b"200 OK") -> Reply:
    """`block` `times` over, without a length; `written` counts what the socket took."""

    async def reply(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 %s\r\nTransfer-Encoding: chunked\r\n\r\n" % status)
        for _ in range(times):
            writer.write(b"%x\r\n%s\r\n" % (len(block), block))
            await writer.drain()
            written[0] += len(block)
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    return reply


async def test_an_answer_past_its_bound_is_cut_and_too_large() -> None:
    written = [0]
    line = b'vllm:e2e_request_latency_seconds_bucket{le="1.0"} 1\n'
    reply = chunked(line * 20_000, 100, written)  # 100 MiB, a megabyte at a time
    async with engine(reply) as url, contextlib.aclosing(Prober(timeout=10)) as prober:
        with pytest.raises(AnswerTooLargeError, match="more than 8 MiB") as caught:
            await prober.activity(url)
    assert caught.value.reason == "AnswerTooLarge"
    # The engine got to write its bound and what the sockets' buffers hold, not 100 MiB.
    assert written[0] < 40 << 20


async def test_a_length_over_the_bound_is_refused_before_reading() -> None:
    async def reply(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 999999999999\r\n\r\n")
        await writer.drain()

    async with engine(reply) as url, EngineHttp() as http:
        with pytest.raises(AnswerTooLargeError, match="more than 64 KiB"):
            await http.request("GET", url + "/is_sleeping", total=5, connect=5)


async def test_a_compressed_answer_is_bounded_as_it_unpacks() -> None:
    bomb = gzip.compress(b"\n" * (64 << 20))  # 64 MiB of empty lines, 64 kB on the wire
    head = b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(bomb)

    async def reply(writer: asyncio.StreamWriter) -> None:
        writer.write(head + bomb)
        await writer.drain()

    async with engine(reply) as url, contextlib.aclosing(Prober(timeout=10)) as prober:
        with pytest.raises(AnswerTooLargeError):
            await prober.activity(url)


async def test_an_error_body_past_its_bound_is_too_large_with_its_status() -> None:
    reply = chunked(b"x" * 65536, 4, [0], status=b"500 Internal Server Error")  # 256 KiB
    async with engine(reply) as url, EngineHttp() as http:
        with pytest.raises(AnswerTooLargeError) as caught:
            await http.request("POST", url + "/wake_up", total=5, connect=5)
    assert caught.value.status == 500


def dripping(body: bytes, every: float) -> Reply:
    async def reply(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        while True:  # a byte at a time, never the whole
            for byte in body:
                writer.write(b"1\r\n%s\r\n" % bytes([byte]))
                await writer.drain()
                await asyncio.sleep(every)

    return reply


async def test_a_dripping_answer_is_cut_at_the_deadline_of_the_whole() -> None:
    # Bytes keep coming every 20 ms: a deadline counted per chunk would never end it.
    async with (
        engine(dripping(GAUGES.encode(), 0.02)) as url,
        contextlib.aclosing(Prober(timeout=0.5)) as prober,
        asyncio.timeout(10),
    ):
        with pytest.raises(EngineTimeoutError, match=r"took longer than 0\.5s"):
            await prober.activity(url)


async def test_an_invalid_value_is_a_failed_probe_naming_it() -> None:
    page = b"vllm:num_requests_running +Inf\nvllm:num_requests_waiting 0\n"

    async def reply(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(page), page))
        await writer.drain()

    async with engine(reply) as url, contextlib.aclosing(Prober()) as prober:
        with pytest.raises(InvalidAnswerError, match=r"num_requests_running is \+Inf") as caught:
            await prober.activity(url)
    assert caught.value.reason == "InvalidAnswer"
    assert url in str(caught.value)


# --- slots: a lease on the shared ones, and turns between owners -------------------------------


def answering(page: bytes) -> Reply:
    async def reply(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(page), page))
        await writer.drain()

    return reply


# The lease: long next to a loaded machine's pauses (an answer from the engine beside it must
# come within it, or that engine too counts as slow), short next to the drips' deadlines.
LEASE = 0.5
NEVER_ENDS = 30.0  # a drip's deadline no test waits for: its task is cancelled


async def test_a_slow_engine_holds_a_shared_slot_no_longer_than_its_lease() -> None:
    ok = (GAUGES + AWAKE).encode()
    async with (
        engine(dripping(ok, 0.05)) as slow,
        engine(answering(ok)) as quick,
        EngineHttp(limit=1, lease=LEASE) as http,
    ):

        async def get(url: str, total: float = 5.0) -> object:
            return await http.request("GET", url + "/metrics", total=total, connect=5.0)

        dripping_one = asyncio.create_task(get(slow, NEVER_ENDS))
        await asyncio.sleep(0)  # it holds the only slot
        async with asyncio.timeout(NEVER_ENDS / 2):  # long before the drip's deadline ends
            await get(quick)
        assert not dripping_one.done()  # it gave its slot back, and goes on without
        assert http.is_slow(slow) and not http.is_slow(quick)
        # From now on its requests wait for slots of their own: the shared one stays free.
        again = asyncio.create_task(get(slow, NEVER_ENDS))
        async with asyncio.timeout(NEVER_ENDS / 2):
            await get(quick)
        assert not again.done()
        for task in (dripping_one, again):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        assert http.overtime == 0


async def test_requests_past_their_lease_go_on_without_a_slot_only_up_to_a_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # On an operator too busy to read answers within the lease, every request overruns it:
    # the requests out at once stay bounded all the same.
    monkeypatch.setattr(http_module, "OVERTIME", 1)
    ok = (GAUGES + AWAKE).encode()
    async with (
        engine(dripping(ok, 0.02)) as first,
        engine(dripping(ok, 0.02)) as second,
        engine(answering(ok)) as quick,
        EngineHttp(limit=1, lease=0.05) as http,
    ):

        async def get(url: str, total: float = NEVER_ENDS) -> object:
            return await http.request("GET", url + "/metrics", total=total, connect=5.0)

        out = asyncio.create_task(get(first))
        await until(lambda: http.overtime == 1, within=10)  # past its lease, out without its slot
        held = asyncio.create_task(get(second))
        await until(lambda: http.is_slow(second), within=10)  # past its lease too
        assert http.overtime == 1  # but it keeps the slot: the bound is reached
        waiting = asyncio.create_task(get(quick, 5.0))
        await asyncio.sleep(0.3)  # six leases: the held one asks again at each, and is refused
        assert not waiting.done() and not out.done()
        out.cancel()  # the bound is free again
        with contextlib.suppress(asyncio.CancelledError):
            await out
        async with asyncio.timeout(NEVER_ENDS / 2):  # the held one goes out at its next lease
            await waiting
        assert http.overtime == 1
        held.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await held
        assert http.overtime == 0


async def test_a_slow_engine_that_answers_within_its_lease_is_slow_no_more() -> None:
    behaviour = [dripping(GAUGES.encode(), 0.05)]

    async def reply(writer: asyncio.StreamWriter) -> None:
        await behaviour[0](writer)

    # Nothing here waits for the lease: it is only the time the answer must come within.
    async with engine(reply) as url, EngineHttp(limit=4, lease=2 * LEASE) as http:
        with pytest.raises(TimeoutError):
            await http.request("GET", url + "/metrics", total=0.3, connect=5.0)
        assert http.is_slow(url)
        behaviour[0] = answering((GAUGES + AWAKE).encode())
        await http.request("GET", url + "/metrics", total=5.0, connect=5.0)
        assert not http.is_slow(url)


async def test_an_engine_that_never_answers_a_wake_keeps_no_other_sleep_waiting() -> None:
    async def never(writer: asyncio.StreamWriter) -> None:
        await asyncio.Event().wait()

    async with (
        engine(never) as hung,
        engine(answering(b"")) as quick,
        new_http_client(max_connections=1, lease=0.1) as http,
    ):
        waking = asyncio.create_task(EngineClient(hung, client=http).wake(1, timeout=30))
        await asyncio.sleep(0.01)  # the wake holds the only slot
        async with asyncio.timeout(5):  # well before the wake's own timeout
            await EngineClient(quick, client=http).sleep(1)
        assert not waking.done()
        waking.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waking


async def test_owners_take_turns_so_one_with_many_waiters_delays_others_by_one() -> None:
    turns = Turns(1)
    order: list[str] = []
    release = asyncio.Event()

    async def take(name: str, owner: str, *, urgent: bool = False) -> None:
        async with turns.turn(urgent=urgent, owner=owner):
            order.append(name)
            if name == "holder":
                await release.wait()

    holder = asyncio.create_task(take("holder", "many"))
    await asyncio.sleep(0)
    waiters = [asyncio.create_task(take(f"many-{i}", "many")) for i in range(4)]
    waiters.append(asyncio.create_task(take("one", "one")))
    waiters.append(asyncio.create_task(take("other", "other")))
    waiters.append(asyncio.create_task(take("first-probe", "many", urgent=True)))
    # A sleep: every waiter queues before the holder lets go; the order they get in is the test.
    await asyncio.sleep(0.01)
    release.set()
    await asyncio.gather(holder, *waiters)
    assert order == [
        "holder",
        "first-probe",  # urgent ones first, as before
        "many-0",
        "one",
        "other",
        "many-1",
        "many-2",
        "many-3",
    ]


# --- gateway replicas: read as engines are ------------------------------------------------------


async def scrape_twice(url: str, metrics: OperatorMetrics) -> GatewayTraffic:
    traffic = GatewayTraffic(api=None, urls=[url + "/metrics"], interval=1, metrics=metrics)
    async with aiohttp.ClientSession() as session:
        await traffic.scrape(session)
        await traffic.scrape(session)
    return traffic


def failures(metrics: OperatorMetrics, reason: str) -> float:
    value = metrics.registry.get_sample_value(
        "snooze_gateway_scrape_failures_total", {"reason": reason}
    )
    return value or 0.0


@pytest.mark.parametrize(
    "page",
    [
        b'snooze_gateway_pod_requests_in_flight{namespace="ns",pod="p"} +Inf\n',
        b'snooze_gateway_pod_requests_total{namespace="ns",pod="p"} -1\n',
        b'snooze_gateway_pod_requests_total{namespace="ns",pod="p"} 1\n'
        b'snooze_gateway_pod_requests_total{pod="p",namespace="ns",x="y"} 2\n',
    ],
    ids=["infinite", "negative", "twice"],
)
async def test_a_replica_page_no_gateway_writes_is_not_used(
    page: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    metrics = OperatorMetrics()
    async with engine(answering(page)) as url:
        traffic = await scrape_twice(url, metrics)
    # Not used: every engine is judged by its probes alone, and the scraper carries on.
    assert traffic.traffic("ns", "p") is None
    assert failures(metrics, "InvalidAnswer") == 2
    told = [r for r in caplog.records if "cannot be used" in r.getMessage()]
    assert len(told) == 1, told  # once, not at every scrape


async def test_a_huge_replica_page_is_cut_at_its_bound() -> None:
    metrics, written = OperatorMetrics(), [0]
    line = b'snooze_gateway_requests_total{namespace="ns",model="m",code="200"} 1\n'
    async with engine(chunked(line * 16_000, 100, written)) as url:  # 110 MB
        traffic = await scrape_twice(url, metrics)
    assert traffic.traffic("ns", "p") is None
    assert failures(metrics, "AnswerTooLarge") == 2
    assert written[0] < 2 * (16 << 20) + (40 << 20)  # two reads of 16 MiB, and buffers


async def test_a_replica_that_answers_again_is_used_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    behaviour = [answering(b"snooze_gateway_pod_requests_total NaN\n")]

    async def reply(writer: asyncio.StreamWriter) -> None:
        await behaviour[0](writer)

    caplog.set_level(logging.INFO, logger="snooze.operator.traffic.gateways")
    traffic = GatewayTraffic(api=None, urls=[], interval=1)
    async with engine(reply) as url, aiohttp.ClientSession() as session:
        traffic.urls = (url + "/metrics",)
        await traffic.scrape(session)
        assert not traffic.complete
        page = b'snooze_gateway_pod_requests_total{namespace="ns",pod="p"} 3\n'
        behaviour[0] = answering(page)
        await traffic.scrape(session)
    assert traffic.complete and traffic.pods[("ns", "p")].sent == 3
    assert any("answers again" in r.getMessage() for r in caplog.records)


async def test_an_idle_answer_past_its_bound_ends_the_wait_quietly() -> None:
    written = [0]
    traffic = GatewayTraffic(api=None, urls=[], interval=1)
    async with (
        engine(chunked(b"1" * 65536, 64, written)) as url,  # 4 MiB of digits
        aiohttp.ClientSession() as session,
        asyncio.timeout(10),
    ):
        await traffic._went_idle(session, url + "/metrics", 0, 0.2)
    assert written[0] < 40 << 20
