"""Probes of many engines over one aiohttp session: the operator's most frequent request, made
cheap (about half the CPU of an httpx request, measured in benchmarks/scrape.py)."""

from __future__ import annotations

import json
import ssl

from snooze.engine.activity import ACTIVITY_METRICS, PROBE_METRICS, ActivitySnapshot, parse_activity
from snooze.engine.errors import (
    EngineError,
    EngineHTTPError,
    EngineTimeoutError,
    classify_answer,
)
from snooze.engine.http import EngineHttp


class Prober:
    """Scrapes engines' `/metrics` (and `/is_sleeping`) for the operator's probes.

    One session for every engine (EngineHttp), at most `limit` requests at once. Every method
    raises only EngineError subclasses.
    """

    def __init__(
        self, *, limit: int = 64, timeout: float = 5.0, ssl_context: ssl.SSLContext | None = None
    ) -> None:
        self.timeout = timeout
        self._http = EngineHttp(limit=limit, ssl_context=ssl_context)
        self._unfiltered: set[str] = set()
        """Engines whose `name[]` filter finds nothing (vLLM with several API servers uses the
        multiprocess collector, which the filter cannot see): scraped whole."""

    async def aclose(self) -> None:
        await self._http.aclose()

    async def activity(
        self, base_url: str, *, share_known: bool = False, urgent: bool = False
    ) -> ActivitySnapshot:
        """The engine's activity, from a filtered scrape (the whole page if the filter fails);
        `urgent` probes go before the others (EngineHttp)."""
        if base_url not in self._unfiltered:
            names = PROBE_METRICS if share_known else ACTIVITY_METRICS
            query = [("name[]", name) for name in names]
            text = await self._get(base_url, "/metrics", query, urgent)
            snapshot = parse_or_raise(text, base_url)
            if snapshot is not None:
                return snapshot
        snapshot = parse_or_raise(await self._get(base_url, "/metrics", None, urgent), base_url)
        if snapshot is None:
            raise _unreadable(base_url, "/metrics", "no request gauges in the payload")
        self._unfiltered.add(base_url)  # only a whole page with the gauges blames the filter
        return snapshot

    async def is_sleeping(self, base_url: str, *, urgent: bool = False) -> bool:
        """For engines that do not publish vllm:engine_sleep_state (before vLLM 0.11.1)."""
        text = await self._get(base_url, "/is_sleeping", None, urgent)
        try:
            value = json.loads(text).get("is_sleeping")
        except (ValueError, AttributeError):
            value = None
        if not isinstance(value, bool):
            raise _unreadable(base_url, "/is_sleeping", 'expected {"is_sleeping": true|false}')
        return value

    async def _get(
        self, base_url: str, path: str, query: list[tuple[str, str]] | None, urgent: bool = False
    ) -> str:
        url = base_url + path
        # The timeout starts once the request has its turn (EngineHttp): aiohttp's own timeout
        # counted the wait for a pooled connection, and healthy engines were reported
        # unreachable (217 of 3,000 in one wave).
        try:
            answer = await self._http.request(
                "GET", url, params=query, total=self.timeout, connect=self.timeout, urgent=urgent
            )
        except TimeoutError as exc:
            raise EngineTimeoutError(
                f"{base_url} took longer than {self.timeout:g}s answering {path}.", url=url
            ) from exc
        if answer.status >= 300:
            raise classify_answer(answer.status, answer.text, url=url, path=path)
        return answer.text


def parse_or_raise(text: str, base_url: str) -> ActivitySnapshot | None:
    try:
        return parse_activity(text)
    except ValueError as exc:
        raise _unreadable(base_url, "/metrics", f"not Prometheus text ({exc})") from exc


def _unreadable(base_url: str, path: str, what: str) -> EngineError:
    return EngineHTTPError(
        f"{base_url}{path} answered something the operator cannot read ({what}). Is this port "
        "a vLLM engine?",
        url=base_url + path,
        status=200,
        message=what,
    )
