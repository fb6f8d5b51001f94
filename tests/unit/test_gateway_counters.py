"""The gateway's per-engine counters, as the operator reads them: one replica's page, several
replicas merged, and a scrape where a replica does not answer."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, generate_latest, start_http_server

from snooze.gateway.metrics import GatewayMetrics
from snooze.operator.traffic.gateways import GatewayTraffic, merge, read_held, read_page
from snooze.policy.probing import Traffic


def test_a_request_is_in_flight_while_sent_and_counted_with_its_end_once_answered() -> None:
    metrics = GatewayMetrics()
    with metrics.sending("team-a", "chat-0", wall=lambda: 1234.5):
        page = read_page(generate_latest(metrics.registry).decode())
        assert page[("team-a", "chat-0")] == Traffic(sent=0, in_flight=1, last=None, at=0.0)
    page = read_page(generate_latest(metrics.registry).decode())
    assert page[("team-a", "chat-0")] == Traffic(sent=1, in_flight=0, last=1234.5, at=0.0)


def test_a_request_that_never_reached_the_engine_is_not_counted() -> None:
    metrics = GatewayMetrics()
    with metrics.sending("team-a", "chat-0") as sending:
        sending.not_sent()
    page = read_page(generate_latest(metrics.registry).decode())
    assert page[("team-a", "chat-0")] == Traffic(sent=0, in_flight=0, last=None, at=0.0)


def test_a_deleted_pods_series_leave_the_page() -> None:
    metrics = GatewayMetrics()
    with metrics.sending("team-a", "chat-0"):
        pass
    metrics.pod_gone("team-a", "chat-0")
    metrics.pod_gone("team-a", "never-seen")  # no series: nothing to do, no error
    assert read_page(generate_latest(metrics.registry).decode()) == {}


def test_a_malformed_page_is_refused() -> None:
    with pytest.raises(ValueError):
        read_page('snooze_gateway_pod_requests_total{namespace="a",pod="b"} many\n')


def test_an_engine_found_stuck_is_counted_for_the_operator() -> None:
    metrics = GatewayMetrics()
    with metrics.sending("team-a", "chat-0", wall=lambda: 1234.5):
        metrics.engine_stalled("team-a", "chat-0")
    metrics.engine_stalled("team-a", "chat-0")
    page = read_page(generate_latest(metrics.registry).decode())
    assert page[("team-a", "chat-0")].stalls == 2
    one = {("ns", "p"): Traffic(sent=1, in_flight=0, last=None, at=10.0, stalls=1)}
    two = {("ns", "p"): Traffic(sent=0, in_flight=0, last=None, at=10.0, stalls=2)}
    assert merge([one, two])[("ns", "p")].stalls == 3


def test_replicas_add_their_counts_and_the_latest_end_wins() -> None:
    one = {("ns", "p"): Traffic(sent=3, in_flight=1, last=100.0, at=10.0)}
    two = {
        ("ns", "p"): Traffic(sent=4, in_flight=0, last=None, at=10.0),
        ("ns", "q"): Traffic(sent=1, in_flight=0, last=90.0, at=10.0),
    }
    three = {("ns", "p"): Traffic(sent=0, in_flight=2, last=120.0, at=10.0)}
    assert merge([one, two, three]) == {
        ("ns", "p"): Traffic(sent=7, in_flight=3, last=120.0, at=10.0),
        ("ns", "q"): Traffic(sent=1, in_flight=0, last=90.0, at=10.0),
    }


@contextmanager
def replica(registry: CollectorRegistry) -> Iterator[str]:
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        yield f"http://127.0.0.1:{server.server_port}/metrics"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def scrape(traffic: GatewayTraffic) -> None:
    async def once() -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
            await traffic.scrape(session)

    asyncio.run(once())


def test_every_replica_answering_makes_an_unseen_pod_a_quiet_one() -> None:
    first, second = GatewayMetrics(), GatewayMetrics()
    with first.sending("ns", "p", wall=lambda: 50.0), second.sending("ns", "p", wall=lambda: 60.0):
        pass
    with replica(first.registry) as one, replica(second.registry) as two:
        traffic = GatewayTraffic(api=None, urls=[one, two], interval=1)
        before = time.time()
        scrape(traffic)
    assert before <= traffic.at <= time.time()
    assert traffic.traffic("ns", "p") == Traffic(sent=2, in_flight=0, last=60.0, at=traffic.at)
    assert traffic.traffic("ns", "other") == Traffic(sent=0, in_flight=0, last=None, at=traffic.at)


def test_a_replica_that_does_not_answer_makes_the_traffic_unknown() -> None:
    # Its requests could be anywhere: the operator must fall back on probes alone.
    metrics = GatewayMetrics()
    with metrics.sending("ns", "p"):
        pass
    with replica(CollectorRegistry()) as gone:
        pass  # a replica that was there and is no more: its port refuses connections
    with replica(metrics.registry) as one:
        traffic = GatewayTraffic(api=None, urls=[one, gone], interval=1, timeout=2)
        scrape(traffic)
    assert traffic.traffic("ns", "p") is None
    assert traffic.traffic("ns", "other") is None


def test_without_a_gateway_nothing_is_known() -> None:
    traffic = GatewayTraffic(api=None, interval=1)
    assert not traffic.enabled
    asyncio.run(traffic.run())  # returns at once: nothing to scrape
    assert traffic.traffic("ns", "p") is None


class Scrapes:
    """Counts a scraper's scrapes, and waits for the n-th."""

    def __init__(self, traffic: GatewayTraffic) -> None:
        self.count = 0
        self._more = asyncio.Event()
        traffic.scraped.append(self._seen)

    def _seen(self) -> None:
        self.count += 1
        self._more.set()

    async def reach(self, count: int) -> None:
        async with asyncio.timeout(10):
            while self.count < count:
                self._more.clear()
                await self._more.wait()


@contextlib.asynccontextmanager
async def running(traffic: GatewayTraffic) -> AsyncIterator[None]:
    task = asyncio.create_task(traffic.run())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def test_a_hurry_scrapes_at_once_and_then_ten_times_per_interval() -> None:
    """A pool waiting for a busy member asks for fresher counters: the scraper stops waiting
    out its interval and scrapes HURRIED times per interval while hurried."""

    async def run() -> tuple[int, int]:
        with replica(GatewayMetrics().registry) as one:
            traffic = GatewayTraffic(api=None, urls=[one], interval=60)
            scrapes = Scrapes(traffic)
            async with running(traffic):
                await scrapes.reach(1)
                # A sleep: proves no second scrape comes for 0.3 s (the next is a minute away).
                await asyncio.sleep(0.3)
                unhurried = scrapes.count  # the next one is a minute away
                traffic.hurry(60)  # 60 / HURRIED: every 6 s from now on
                traffic.hurry(60)  # a second ask while hurried does not scrape again
                await scrapes.reach(unhurried + 1)
                # A sleep: proves the second ask scrapes no more, for 0.3 s.
                await asyncio.sleep(0.3)
                return unhurried, scrapes.count

    assert asyncio.run(run()) == (1, 2)


def test_hurried_scrapes_come_a_tenth_of_an_interval_apart() -> None:
    async def run() -> int:
        with replica(GatewayMetrics().registry) as one:
            traffic = GatewayTraffic(api=None, urls=[one], interval=3.0)
            scrapes = Scrapes(traffic)
            traffic.hurry(60)
            async with running(traffic):
                # Five hurried gaps of 0.3 s; unhurried they would take 15 s, past reach's 10.
                await scrapes.reach(6)
                return scrapes.count

    assert asyncio.run(run()) >= 6


def test_the_requests_held_for_each_model_s_wake_are_summed_over_replicas() -> None:
    # A GPU pool gives no place to a wake whose held requests are all gone: it reads them here.
    first, second = GatewayMetrics(), GatewayMetrics()
    with (
        first.held("ns", "big"),
        second.held("ns", "big"),
        second.held("ns", "small"),
        replica(first.registry) as one,
        replica(second.registry) as two,
    ):
        traffic = GatewayTraffic(api=None, urls=[one, two], interval=1)
        scrape(traffic)
    assert traffic.held("ns", "big") == 2
    assert traffic.held("ns", "small") == 1
    assert traffic.held("ns", "never-asked") == 0
    assert traffic.held("other", "big") == 0


def test_the_held_requests_are_unknown_while_a_replica_does_not_answer() -> None:
    metrics = GatewayMetrics()
    with replica(CollectorRegistry()) as gone:
        pass
    with metrics.held("ns", "big"), replica(metrics.registry) as one:
        traffic = GatewayTraffic(api=None, urls=[one, gone], interval=1, timeout=2)
        scrape(traffic)
    assert traffic.held("ns", "big") is None  # the other replica may hold some: unknown


def test_a_held_count_that_is_not_a_count_reads_as_some_request_held() -> None:
    page = (
        'snooze_gateway_held_requests{namespace="ns",model="a"} NaN\n'
        'snooze_gateway_held_requests{namespace="ns",model="b"} -3\n'
        'snooze_gateway_held_requests{namespace="ns",model="c"} 0\n'
    )
    assert read_held(page) == {("ns", "a"): 1, ("ns", "b"): 1, ("ns", "c"): 0}
