"""The gateway's /idle, and the operator waiting on it: while a GPU pool waits for a busy
member, the moment an engine's last request ends reaches the operator at once, not at its
next scrape a tenth of a probe interval later."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx
import pytest
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from snooze.api.agreed import POD_IN_FLIGHT, PODS_WENT_IDLE
from snooze.gateway import metrics_port
from snooze.gateway.metrics import GatewayMetrics
from snooze.gateway.metrics_port import MOST_WAITERS, IdleSignal
from snooze.operator.traffic.gateways import SOONEST, GatewayTraffic, went_idle

from .test_gateway_counters import Scrapes, running


@contextmanager
def port(metrics: GatewayMetrics) -> Iterator[str]:
    """The gateway's metrics port on loopback, as `snooze gateway --metrics-port` serves it."""
    server, thread = metrics_port.serve(0, metrics.registry, metrics.idle, addr="127.0.0.1")
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_an_engine_goes_idle_when_its_last_request_ends_not_before() -> None:
    metrics = GatewayMetrics()
    with metrics.sending("ns", "p"):
        with metrics.sending("ns", "p"):
            pass
        assert metrics.idle.count == 0  # one still in flight
        with metrics.sending("ns", "q") as sending:
            sending.not_sent()  # never reached q, but q has nothing in flight any more
        assert metrics.idle.count == 1
    assert metrics.idle.count == 2
    page = generate_latest(metrics.registry).decode()
    assert went_idle(page) == 2


@pytest.mark.parametrize("value", ["+Inf", "NaN", "-Inf"])
def test_a_count_that_is_no_number_of_times_cannot_be_waited_on(value: str) -> None:
    """Whatever answers at a replica's address is read as a page: a count of +Inf must not
    stop the scraper (int() of it raises), only make that replica one not waited on."""
    assert went_idle(f"{PODS_WENT_IDLE} {value}\n") is None


def test_the_page_counts_an_engine_gone_idle_before_it_shows_its_requests_in_flight() -> None:
    """A page read while a request ends must not show the engine busy and count it idle:
    the operator would then wait for the next engine to go idle. Collected in this order,
    a page that counts the end was read after the in-flight count dropped."""
    page = generate_latest(GatewayMetrics().registry).decode()
    assert page.index(PODS_WENT_IDLE) < page.index(POD_IN_FLIGHT)


def test_a_page_without_the_count_cannot_be_waited_on() -> None:
    registry = CollectorRegistry()
    Gauge(POD_IN_FLIGHT, "in flight", ["namespace", "pod"], registry=registry).labels("ns", "p")
    assert went_idle(generate_latest(registry).decode()) is None


def test_a_wait_ends_when_an_engine_goes_idle_and_otherwise_at_its_timeout() -> None:
    metrics = GatewayMetrics()
    with port(metrics) as url, ThreadPoolExecutor(2) as threads:
        quiet = httpx.get(f"{url}/idle", params={"after": 0, "timeout": 0.2})
        assert (quiet.status_code, quiet.text) == (200, "0\n")
        # A request ends while a wait of 30 s is under way: the wait answers then.
        waiting = threads.submit(httpx.get, f"{url}/idle", params={"after": 0, "timeout": 30})
        while not metrics.idle.waiters:
            threading.Event().wait(0.01)
        with metrics.sending("ns", "p"):
            assert not waiting.done()
        answer = waiting.result(10)  # long before the 30 s
        assert (answer.status_code, answer.text) == (200, "1\n")
        # A count already above `after` answers at once; so does one below it (the replica
        # restarted since the caller read its page).
        assert httpx.get(f"{url}/idle", params={"after": 0, "timeout": 30}).text == "1\n"
        assert httpx.get(f"{url}/idle", params={"after": 7, "timeout": 30}).text == "1\n"
        # The page is served beside it, as before.
        assert went_idle(httpx.get(f"{url}/metrics").text) == 1


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        ({}, "give after=N (an integer) and timeout=SECONDS"),
        ({"after": "x", "timeout": "1"}, "give after=N"),
        ({"after": "0", "timeout": "soon"}, "give after=N"),
        ({"after": "0", "timeout": "31"}, "timeout must be 0 to 30 seconds"),
        ({"after": "0", "timeout": "-1"}, "timeout must be 0 to 30 seconds"),
        ({"after": "0", "timeout": "nan"}, "timeout must be 0 to 30 seconds"),
        ({"after": "0", "timeout": "inf"}, "timeout must be 0 to 30 seconds"),
    ],
)
def test_a_bad_wait_is_refused_with_what_to_give(query: dict[str, str], reason: str) -> None:
    with port(GatewayMetrics()) as url:
        answer = httpx.get(f"{url}/idle", params=query)
    assert answer.status_code == 400
    assert reason in answer.text


def test_waiters_are_bounded_and_the_one_too_many_is_told_so() -> None:
    """Whoever reaches the port may wait there, and each waiter holds a thread."""
    signal = IdleSignal()
    with ThreadPoolExecutor(MOST_WAITERS) as threads:
        waits = [threads.submit(signal.wait, 0, 30) for _ in range(MOST_WAITERS)]
        while signal.waiters < MOST_WAITERS:
            threading.Event().wait(0.01)
        assert signal.wait(0, 30) is None  # at once: no thread of its own
        signal.went_idle()
        assert [w.result(10) for w in waits] == [1] * MOST_WAITERS
    assert signal.waiters == 0


def test_a_hurried_scraper_scrapes_again_as_soon_as_an_engine_goes_idle() -> None:
    """Hurried with a 120 s interval, its next scrape is 12 s away, past Scrapes.reach's 10 s
    bound: only the replica's /idle can bring it sooner."""
    metrics = GatewayMetrics()

    async def run() -> tuple[int, int]:
        with port(metrics) as url:
            traffic = GatewayTraffic(api=None, urls=[f"{url}/metrics"], interval=120)
            scrapes = Scrapes(traffic)
            traffic.hurry(600)
            async with running(traffic):
                await scrapes.reach(1)
                # A sleep: proves no scrape comes for half a second while no engine went idle.
                await asyncio.sleep(0.5)
                unchanged = scrapes.count  # waiting on /idle, no engine went idle
                with metrics.sending("ns", "p"):
                    pass
                await scrapes.reach(unchanged + 1)
                assert traffic.traffic("ns", "p") is not None
                return unchanged, scrapes.count

    assert asyncio.run(run()) == (1, 2)


def test_an_unhurried_scraper_does_not_wait_on_idle() -> None:
    metrics = GatewayMetrics()

    async def run() -> int:
        with port(metrics) as url:
            traffic = GatewayTraffic(api=None, urls=[f"{url}/metrics"], interval=120)
            scrapes = Scrapes(traffic)
            async with running(traffic):
                await scrapes.reach(1)
                with metrics.sending("ns", "p"):
                    pass
                # A sleep: proves an unhurried scraper scrapes no more for half a second.
                await asyncio.sleep(0.5)
                return scrapes.count

    assert asyncio.run(run()) == 1
    assert metrics.idle.waiters == 0


def test_a_gateway_whose_engines_go_idle_all_the_time_is_scraped_at_most_soonest_times() -> None:
    """On a busy gateway nearly every request's end leaves an engine idle: the scraper
    scrapes no more than SOONEST times per interval (here every 0.2 s, hurried every 2 s)."""
    metrics = GatewayMetrics()
    ending = threading.Event()

    def requests() -> None:
        while not ending.is_set():
            with metrics.sending("ns", "p"):
                pass
            threading.Event().wait(0.005)

    async def run() -> int:
        with port(metrics) as url, ThreadPoolExecutor(1) as threads:
            traffic = GatewayTraffic(api=None, urls=[f"{url}/metrics"], interval=SOONEST * 0.2)
            scrapes = Scrapes(traffic)
            traffic.hurry(600)
            async with running(traffic):
                await scrapes.reach(1)
                threads.submit(requests)
                # A sleep: the busy traffic runs for 1.2 s; the scrapes counted in it are the test.
                await asyncio.sleep(1.2)
                ending.set()
                return scrapes.count

    count = asyncio.run(run())
    assert 2 <= count <= 10, count  # sooner than every 2 s; never sooner than every 0.2 s
