"""What the gateway's replicas say of each engine's traffic: one scrape of each replica per
probe interval tells the operator which engines served requests and when, so that it need
not probe an engine whose requests all come through the gateway (policy/probing.py). While a
GPU pool waits for a busy member, each replica is also asked to answer the moment an engine's
last request ends (its /idle), and is scraped again then."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable
from urllib.parse import urljoin

import aiohttp

from snooze.engine.activity import label, samples
from snooze.kube.api import KubeApi, KubeError, Ref
from snooze.policy.probing import Traffic

log = logging.getLogger(__name__)
SENT = "snooze_gateway_pod_requests_total"
IN_FLIGHT = "snooze_gateway_pod_requests_in_flight"
LAST = "snooze_gateway_pod_last_request_timestamp_seconds"
FAMILIES = frozenset({SENT, IN_FLIGHT, LAST})
WENT_IDLE = "snooze_gateway_pods_went_idle_total"
HELD = "snooze_gateway_held_requests"
# While a GPU pool waits for a busy member to finish, the replicas are scraped this many times
# per interval, and also as soon as one says an engine went idle: a burst's idle gaps last
# seconds, and the pool must see one to use it...
HURRIED = 10
# ... but never more often than this many times per interval.
SOONEST = 100
# The gateway's own bound on a wait at /idle (gateway/metrics_port.py: LONGEST_WAIT).
LONGEST_IDLE_WAIT = 30.0


def read_page(text: str, at: float = 0.0) -> dict[tuple[str, str], Traffic]:
    """Pure: one replica's page, scraped from `at` on, as (namespace, pod) -> Traffic;
    ValueError if malformed."""
    sent: dict[tuple[str, str], float] = {}
    flight: dict[tuple[str, str], float] = {}
    last: dict[tuple[str, str], float] = {}
    for name, labels, value in samples(text, FAMILIES):
        key = (label(labels, "namespace") or "", label(labels, "pod") or "")
        {SENT: sent, IN_FLIGHT: flight, LAST: last}[name][key] = value
    return {
        key: Traffic(
            sent=sent.get(key, 0.0),
            in_flight=round(flight.get(key, 0.0)),
            last=last.get(key),
            at=at,
        )
        for key in sent.keys() | flight.keys() | last.keys()
    }


def read_held(text: str) -> dict[tuple[str, str], int]:
    """Pure: the requests one replica holds for each model's wake, as (namespace, model) ->
    count (a value that is not a count reads as one: some request is held)."""
    held: dict[tuple[str, str], int] = {}
    for _, labels, value in samples(text, frozenset({HELD})):
        key = (label(labels, "namespace") or "", label(labels, "model") or "")
        count = int(value) if math.isfinite(value) and value >= 0 else 1
        held[key] = held.get(key, 0) + count
    return held


def went_idle(text: str) -> int | None:
    """Pure: how many times an engine went idle through this replica, as its page says (None:
    a gateway too old to say, or a count that is not a number of times: it is not waited on)."""
    for _, _, value in samples(text, frozenset({WENT_IDLE})):
        return int(value) if math.isfinite(value) else None
    return None


def idle_url(metrics_url: str) -> str:
    """A replica's /idle, beside its metrics page (http://10.0.0.7:9091/metrics ->
    http://10.0.0.7:9091/idle)."""
    return urljoin(metrics_url, "idle")


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
    ) -> None:
        self.api = api
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
    ) -> tuple[dict[tuple[str, str], Traffic], int | None, dict[tuple[str, str], int]] | None:
        """A replica's page, its count of engines gone idle and the requests it holds per
        model; None if it did not answer."""
        query = [("name[]", name) for name in sorted(FAMILIES | {WENT_IDLE, HELD})]
        try:
            async with session.get(url, params=query) as response:
                response.raise_for_status()
                text = await response.text()
                page = read_page(text, began)
                held = read_held(text)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.debug("gateway replica %s did not answer: %s", url, exc)
            return None
        return page, went_idle(text), held

    async def _went_idle(
        self, session: aiohttp.ClientSession, url: str, after: int, wait: float
    ) -> None:
        """Returns when the replica's count of engines gone idle is no longer `after` (one
        went idle, or the replica restarted); else (no change, no answer, a gateway without
        /idle) not before `wait` seconds."""
        deadline = time.monotonic() + wait
        query = {"after": str(after), "timeout": f"{min(wait, LONGEST_IDLE_WAIT):.3f}"}
        timeout = aiohttp.ClientTimeout(total=wait + self.timeout)
        try:
            async with session.get(idle_url(url), params=query, timeout=timeout) as response:
                response.raise_for_status()
                if int(await response.text()) != after:
                    return
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.debug("gateway replica %s cannot be waited on: %s", url, exc)
        await asyncio.sleep(max(0.0, deadline - time.monotonic()))

    async def _discovered(self) -> list[str]:
        if self.service is None or self.api is None:
            return []
        namespace, _, name = self.service.partition("/")
        ref = Ref(f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices")
        try:
            listing = await self.api.list(ref, label_selector=f"kubernetes.io/service-name={name}")
        except KubeError as exc:
            log.warning("cannot list the gateway's endpoints (%s): %s", self.service, exc)
            return []
        urls = []
        for slice_ in listing.get("items") or []:
            ports = slice_.get("ports") or []
            port = next(
                (p for p in ports if p.get("name") == "metrics"), ports[0] if ports else None
            )
            if port is None or not port.get("port"):
                continue
            for endpoint in slice_.get("endpoints") or []:
                if (endpoint.get("conditions") or {}).get("ready") is False:
                    continue
                for address in endpoint.get("addresses") or []:
                    host = f"[{address}]" if ":" in address else address
                    urls.append(f"http://{host}:{port['port']}/metrics")
        return urls


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
