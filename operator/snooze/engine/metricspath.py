"""Which of an engine's metrics paths filters `name[]`, learned per engine, and the scrape that
follows it: a probe reads the few lines it asks for, not a page of histograms.

vLLM mounts prometheus_client's app on every path under /metrics, and that app filters on
`name[]`. From 0.8.5 vLLM also registers the instrumentator's own GET /metrics first, which
serves the whole page whatever is asked (docs/vllm-contract.md). So /metrics/ is asked first;
an engine that has no such path (404: not vLLM's server, or a front that knows only /metrics)
is asked /metrics from then on; and one whose filter finds nothing (vLLM with several API
servers: the multiprocess collector is invisible to the filter) is read whole.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence

from snooze.engine.activity import ActivitySnapshot
from snooze.engine.errors import EngineHTTPError

FILTERING = "/metrics/"
PLAIN = "/metrics"
# Engines remembered (each a base URL): ten thousand fit many times over; the oldest go first.
REMEMBERED = 65536

Query = list[tuple[str, str]] | None
Scrape = Callable[[str, Query], Awaitable[ActivitySnapshot | None]]
"""Reads one page: (path, query) -> the activity on it, None if it has no request gauges."""


class _Seen:
    """A bounded set of engines, the most recently noted kept."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._urls: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, url: str) -> bool:
        return url in self._urls

    def add(self, url: str) -> None:
        self._urls[url] = None
        self._urls.move_to_end(url)
        while len(self._urls) > self._limit:
            self._urls.popitem(last=False)


class MetricsPaths:
    """What each engine's metrics paths do, as its answers showed."""

    def __init__(self, *, remembered: int = REMEMBERED) -> None:
        self._no_slash = _Seen(remembered)
        """Engines that answered 404 on /metrics/."""
        self._unfiltered = _Seen(remembered)
        """Engines whose filtered page had no request gauges, while the whole page had."""

    def path(self, base_url: str) -> str:
        return PLAIN if base_url in self._no_slash else FILTERING

    def filters(self, base_url: str) -> bool:
        return base_url not in self._unfiltered

    async def activity(
        self, base_url: str, names: Sequence[str], scrape: Scrape
    ) -> ActivitySnapshot | None:
        """The engine's activity, from a filtered page where its filter works, else from the
        whole page; None when neither has the request gauges (the caller says so). What
        `scrape` raises goes on, but for the 404 that shows an engine has no /metrics/."""
        if self.filters(base_url):
            query = [("name[]", name) for name in names]
            snapshot = await self._scrape(base_url, query, scrape)
            if snapshot is not None:
                return snapshot
        snapshot = await self._scrape(base_url, None, scrape)
        if snapshot is not None:
            self._unfiltered.add(base_url)  # only a whole page with the gauges blames the filter
        return snapshot

    async def _scrape(self, base_url: str, query: Query, scrape: Scrape) -> ActivitySnapshot | None:
        path = self.path(base_url)
        try:
            return await scrape(path, query)
        except EngineHTTPError as error:
            if path != FILTERING or error.status != 404:
                raise
        self._no_slash.add(base_url)
        return await scrape(PLAIN, query)
