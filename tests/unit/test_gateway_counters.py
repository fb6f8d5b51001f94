"""The gateway's per-engine counters, as the operator reads them: one replica's page, several
replicas merged, and a scrape where a replica does not answer."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, generate_latest, start_http_server

from snooze.gateway.metrics import GatewayMetrics
from snooze.operator.gateways import GatewayTraffic, merge, read_page
from snooze.policy.probing import Traffic


def test_a_request_is_in_flight_while_sent_and_counted_with_its_end_once_answered() -> None:
    metrics = GatewayMetrics()
    with metrics.sending("team-a", "chat-0", wall=lambda: 1234.5):
        page = read_page(generate_latest(metrics.registry).decode())
        assert page[("team-a", "chat-0")] == Traffic(sent=0, in_flight=1, last=None)
    page = read_page(generate_latest(metrics.registry).decode())
    assert page[("team-a", "chat-0")] == Traffic(sent=1, in_flight=0, last=1234.5)


def test_a_request_that_never_reached_the_engine_is_not_counted() -> None:
    metrics = GatewayMetrics()
    with metrics.sending("team-a", "chat-0") as sending:
        sending.not_sent()
    page = read_page(generate_latest(metrics.registry).decode())
    assert page[("team-a", "chat-0")] == Traffic(sent=0, in_flight=0, last=None)


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


def test_replicas_add_their_counts_and_the_latest_end_wins() -> None:
    one = {("ns", "p"): Traffic(sent=3, in_flight=1, last=100.0)}
    two = {
        ("ns", "p"): Traffic(sent=4, in_flight=0, last=None),
        ("ns", "q"): Traffic(sent=1, in_flight=0, last=90.0),
    }
    three = {("ns", "p"): Traffic(sent=0, in_flight=2, last=120.0)}
    assert merge([one, two, three]) == {
        ("ns", "p"): Traffic(sent=7, in_flight=3, last=120.0),
        ("ns", "q"): Traffic(sent=1, in_flight=0, last=90.0),
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
        scrape(traffic)
    assert traffic.traffic("ns", "p") == Traffic(sent=2, in_flight=0, last=60.0)
    assert traffic.traffic("ns", "other") == Traffic(sent=0, in_flight=0, last=None)


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
