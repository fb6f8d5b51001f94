"""What the gateway's replicas say of each engine's traffic: one scrape of each replica per
probe interval tells the operator which engines served requests and when, so that it need
not probe an engine whose requests all come through the gateway (policy/probing.py), unless
a replica found it stuck since (it started no answer while requests waited on it). While a
GPU pool waits for a busy member, each replica is also asked to answer the moment an engine's
last request ends (its /idle), and is scraped again then. What a replica answers is read as
an engine's answers are: bounded in size and time, a chunk at a time, every value checked."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable
from urllib.parse import urljoin

import aiohttp

from snooze.api.agreed import (
    HELD_REQUESTS,
    IDLE_LONGEST_WAIT,
    IDLE_PATH,
    POD_IN_FLIGHT,
    POD_LAST_REQUEST,
    POD_REQUESTS,
    POD_STALLS,
    PODS_WENT_IDLE,
)
from snooze.api.reasons import FailureReason
from snooze.engine.activity import REQUESTS_LIMIT
from snooze.engine.exposition import COUNTER_LIMIT, Labels, Page, checked_count
from snooze.engine.http import TooLarge, read_bounded
from snooze.kube.api import KubeApi, KubeError
from snooze.kube.inferencepools import endpointslices_ref, ready_addresses
from snooze.operator.metrics import OperatorMetrics
from snooze.policy.probing import Traffic

log = logging.getLogger(__name__)
FAMILIES = frozenset({POD_REQUESTS, POD_IN_FLIGHT, POD_LAST_REQUEST, POD_STALLS})
# While a GPU pool waits for a busy member to finish, the replicas are scraped this many times
# per interval, and also as soon as one says an engine went idle: a burst's idle gaps last
# seconds, and the pool must see one to use it...
HURRIED = 10
# ... but never more often than this many times per interval.
SOONEST = 100
# The most read of a replica's page: three series of about 120 bytes per engine it sent
# requests to, so about 45,000 engines.
PAGE_LIMIT = 16 << 20
SERIES_LIMIT = 3 * 65536
# A replica's /idle answers one count.
IDLE_LIMIT = 1024
Key = tuple[str, str]


class ReplicaPage:
    """One replica's page, fed a chunk at a time: its traffic per (namespace, pod), scraped
    from `at` on, and its count of engines gone idle. ValueError for a malformed page or a
    value no gateway writes (a count that is NaN, infinite or negative, two series for one
    engine): the page is then not used at all."""

    def __init__(self, at: float = 0.0) -> None:
        self.at = at
        self._page = Page(
            FAMILIES | {PODS_WENT_IDLE, HELD_REQUESTS}, self._sample, series_limit=SERIES_LIMIT
        )
        self._values: dict[str, dict[Key, float]] = {
            POD_REQUESTS: {},
            POD_IN_FLIGHT: {},
            POD_LAST_REQUEST: {},
            POD_STALLS: {},
        }
        self._went_idle: int | None = None
        self._held: dict[Key, int] = {}

    def feed(self, chunk: bytes) -> None:
        self._page.feed(chunk)

    def result(self) -> tuple[dict[Key, Traffic], int | None, dict[Key, int]]:
        self._page.close()
        sent, flight, last, stalls = (
            self._values[name]
            for name in (POD_REQUESTS, POD_IN_FLIGHT, POD_LAST_REQUEST, POD_STALLS)
        )
        traffic = {
            key: Traffic(
                sent=sent.get(key, 0.0),
                in_flight=round(flight.get(key, 0.0)),
                last=last.get(key),
                at=self.at,
                stalls=stalls.get(key, 0.0),
            )
            for key in sent.keys() | flight.keys() | last.keys() | stalls.keys()
        }
        return traffic, self._went_idle, self._held

    def _sample(self, name: str, labels: Labels, value: float) -> None:
        if name == HELD_REQUESTS:
            # Requests held for a (namespace, model)'s wake; a value that is not a count reads
            # as one: some request is held.
            model = (labels.get("namespace") or "", labels.get("model") or "")
            count = min(int(value), REQUESTS_LIMIT) if math.isfinite(value) and value >= 0 else 1
            self._held[model] = self._held.get(model, 0) + count
            return
        if name == PODS_WENT_IDLE:
            # A count that is no number of times only makes the replica one not waited on.
            self._went_idle = int(value) if math.isfinite(value) and value >= 0 else None
            return
        key = (labels.get("namespace") or "", labels.get("pod") or "")
        values = self._values[name]
        if key in values:
            raise ValueError(f"two series of {name} for {key[0]}/{key[1]}")
        values[key] = checked_count(
            name, value, REQUESTS_LIMIT if name == POD_IN_FLIGHT else COUNTER_LIMIT
        )


def read_page(text: str, at: float = 0.0) -> dict[Key, Traffic]:
    """Pure: one replica's whole page, scraped from `at` on, as (namespace, pod) -> Traffic;
    ValueError as ReplicaPage says."""
    page = ReplicaPage(at)
    page.feed(text.encode())
    return page.result()[0]


def read_held(text: str) -> dict[Key, int]:
    """Pure: the requests one replica holds for each model's wake, as (namespace, model) ->
    count; ValueError as ReplicaPage says."""
    page = ReplicaPage()
    page.feed(text.encode())
    return page.result()[2]


def went_idle(text: str) -> int | None:
    """Pure: how many times an engine went idle through this replica, as its page says (None:
    a gateway too old to say, or a count that is not a number of times: it is not waited on)."""
    page = ReplicaPage()
    page.feed(text.encode())
    return page.result()[1]


def idle_url(metrics_url: str) -> str:
    """A replica's /idle, beside its metrics page (http://10.0.0.7:9091/metrics ->
    http://10.0.0.7:9091/idle)."""
    return urljoin(metrics_url, IDLE_PATH.lstrip("/"))


def merge(pages: Iterable[dict[tuple[str, str], Traffic]]) -> dict[tuple[str, str], Traffic]:
    """Pure: every replica's view of a pod, together (counts summed, the latest end)."""
    merged: dict[tuple[str, str], Traffic] = {}
    for page in pages:
        for key, traffic in page.items():
            known = merged.get(key)
            if known is None:
                merged[key] = traffic
                continue
            lasts = [t for t in (known.last, traffic.last) if t is not None]
            merged[key] = Traffic(
                sent=known.sent + traffic.sent,
                in_flight=known.in_flight + traffic.in_flight,
                last=max(lasts) if lasts else None,
                at=min(known.at, traffic.at),
                stalls=known.stalls + traffic.stalls,
            )
    return merged


class GatewayTraffic:
    """Scrapes the gateway's replicas every `interval`: the URLs given, or the endpoints of its
    metrics Service (`namespace/name`, from its EndpointSlices)."""

    def __init__(
        self,
        *,
        api: KubeApi | None,
        urls: Iterable[str] = (),
        service: str | None = None,
        interval: float,
        timeout: float = 5.0,
        metrics: OperatorMetrics | None = None,
    ) -> None:
        self.api = api
        self.metrics = metrics
        self._failing: dict[str, str] = {}
        """Replica URL -> why its last scrape failed, so that each failure is logged once."""
        self.urls = tuple(urls)
        self.service = service
        self.interval = interval
        self.timeout = timeout
        self.pods: dict[tuple[str, str], Traffic] = {}
        self.complete = False
        """Every replica answered the last scrape: a pod missing from it had no traffic."""
        self.at = 0.0
        """When the last scrape began: its counters are at least this recent."""
        self.hurried_until = 0.0
        """Until then (monotonic clock), scrapes come HURRIED times per interval."""
        self._hurry = asyncio.Event()
        self.scraped: list[Callable[[], None]] = []
        """Called after each scrape (the pools that wait for a busy member look again)."""
        self.idled: dict[str, int] = {}
        """Replica URL -> its count of engines gone idle, as its last page said."""
        self.holding: dict[tuple[str, str], int] = {}
        """(namespace, model) -> requests held for its wake, by every replica together."""

    @property
    def enabled(self) -> bool:
        return bool(self.urls or self.service)

    def traffic(self, namespace: str, pod: str) -> Traffic | None:
        """A pod's traffic through the gateway; None when it cannot be known (no gateway
        given, or a replica did not answer), so that probes alone judge the engine."""
        if not self.complete:
            return None
        quiet = Traffic(sent=0.0, in_flight=0, last=None, at=self.at)
        return self.pods.get((namespace, pod), quiet)

    def held(self, namespace: str, model: str) -> int | None:
        """Requests the gateway holds for a model's wake now; None when it cannot be known (no
        gateway given, or a replica did not answer)."""
        if not self.complete:
            return None
        return self.holding.get((namespace, model), 0)

    def hurry(self, seconds: float) -> None:
        """Scrape HURRIED times per interval for the next `seconds` (now, if not already)."""
        now = time.monotonic()
        if now >= self.hurried_until:
            self._hurry.set()
        self.hurried_until = max(self.hurried_until, now + seconds)

    async def run(self) -> None:
        """Scrape until cancelled."""
        if not self.enabled:
            return
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                self._hurry.clear()
                began = time.monotonic()
                await self.scrape(session)
                for listener in self.scraped:
                    listener()
                hurried = time.monotonic() < self.hurried_until
                wait = self.interval / HURRIED if hurried else self.interval
                waits: list[Awaitable[object]] = [self._hurry.wait()]
                if hurried:
                    waits += [self._went_idle(session, *at, wait) for at in self.idled.items()]
                await first(waits, wait)
                # On a busy gateway an engine goes idle at nearly every request's end: scraped
                # no more than SOONEST times per interval, whatever /idle says.
                await asyncio.sleep(began + self.interval / SOONEST - time.monotonic())

    async def scrape(self, session: aiohttp.ClientSession) -> None:
        urls = list(self.urls) + await self._discovered()
        began = time.time()
        pages = await asyncio.gather(*(self._page(session, url, began) for url in urls))
        answered = [page for page, _, _ in filter(None, pages)]
        self.pods = merge(answered)
        holding: dict[tuple[str, str], int] = {}
        for _, _, held in filter(None, pages):
            for key, count in held.items():
                holding[key] = holding.get(key, 0) + count
        self.holding = holding
        self.at = began
        self.complete = bool(urls) and len(answered) == len(urls)
        counts = zip(urls, pages, strict=True)
        self.idled = {url: got[1] for url, got in counts if got and got[1] is not None}

    async def _page(
        self, session: aiohttp.ClientSession, url: str, began: float
    ) -> tuple[dict[Key, Traffic], int | None, dict[Key, int]] | None:
        """A replica's page, its count of engines gone idle and the requests it holds per
        model; None if it did not answer, or answered what cannot be used (too long, too
        slow, a value no gateway writes)."""
        query = [("name[]", name) for name in sorted(FAMILIES | {PODS_WENT_IDLE, HELD_REQUESTS})]
        page = ReplicaPage(began)
        try:
            # The whole page within the timeout, a chunk at a time, nothing kept but counts.
            async with asyncio.timeout(self.timeout), session.get(url, params=query) as response:
                response.raise_for_status()
                await read_bounded(response, limit=PAGE_LIMIT, sink=page.feed)
            found = page.result()
        except (aiohttp.ClientError, TimeoutError, ValueError, TooLarge) as exc:
            self._failed(url, exc)
            return None
        if self._failing.pop(url, None) is not None:
            log.info("gateway replica %s answers again", url)
        return found

    def _failed(self, url: str, error: Exception) -> None:
        """Count a replica's failed scrape by reason; log it once, until it answers again or
        fails for another reason."""
        if isinstance(error, TooLarge):
            reason, what = (
                FailureReason.ANSWER_TOO_LARGE,
                f"its page is {error}, more than the operator reads",
            )
        elif isinstance(error, TimeoutError):
            reason, what = FailureReason.TIMEOUT, f"its page took longer than {self.timeout:g}s"
        elif isinstance(error, aiohttp.ClientResponseError):
            reason, what = FailureReason.HTTP_ERROR, f"it answered {error.status}"
        elif isinstance(error, aiohttp.ClientError):
            reason, what = FailureReason.UNREACHABLE, str(error) or type(error).__name__
        else:
            reason, what = (
                FailureReason.INVALID_ANSWER,
                f"its page cannot be read or believed ({error})",
            )
        if self.metrics is not None:
            self.metrics.gateway_scrape_failures.labels(reason).inc()
        if self._failing.get(url) != reason:
            self._failing[url] = reason
            log.warning(
                "gateway replica %s cannot be used (%s): %s; until it can, engines are judged "
                "by their probes alone",
                url,
                reason,
                what,
            )
        else:
            log.debug("gateway replica %s did not answer: %s", url, what)

    async def _went_idle(
        self, session: aiohttp.ClientSession, url: str, after: int, wait: float
    ) -> None:
        """Returns when the replica's count of engines gone idle is no longer `after` (one
        went idle, or the replica restarted); else (no change, no answer, a gateway without
        /idle) not before `wait` seconds."""
        deadline = time.monotonic() + wait
        query = {"after": str(after), "timeout": f"{min(wait, IDLE_LONGEST_WAIT):.3f}"}
        try:
            async with (
                asyncio.timeout(wait + self.timeout),
                session.get(idle_url(url), params=query) as response,
            ):
                response.raise_for_status()
                if int(await read_bounded(response, limit=IDLE_LIMIT)) != after:
                    return
        except (aiohttp.ClientError, TimeoutError, ValueError, TooLarge) as exc:
            log.debug("gateway replica %s cannot be waited on: %s", url, exc)
        await asyncio.sleep(max(0.0, deadline - time.monotonic()))

    async def _discovered(self) -> list[str]:
        if self.service is None or self.api is None:
            return []
        namespace, _, name = self.service.partition("/")
        ref = endpointslices_ref(namespace)
        try:
            listing = await self.api.list(ref, label_selector=f"kubernetes.io/service-name={name}")
        except KubeError as exc:
            log.warning("cannot list the gateway's endpoints (%s): %s", self.service, exc)
            return []
        addresses, _ = ready_addresses(listing.get("items") or [], None)
        return [f"http://{address}/metrics" for address in addresses]


async def first(waits: Iterable[Awaitable[object]], seconds: float) -> None:
    """Wait until the first of `waits` ends or `seconds` pass; cancel the others."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def stop(task: asyncio.Task[None] | None) -> None:
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
