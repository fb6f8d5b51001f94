"""Probes of many engines over one aiohttp session: the operator's most frequent request, made
cheap (about half the CPU of an httpx request, measured in benchmarks/scrape.py), bounded in
what it reads, and kept from waiting on engines that answer slowly (engine/http.py's lease)."""

from __future__ import annotations

import json
import ssl
from collections.abc import Hashable

from snooze.engine.activity import (
    ACTIVITY_METRICS,
    METRICS_LIMIT,
    PROBE_METRICS,
    ActivityReader,
    ActivitySnapshot,
)
from snooze.engine.errors import (
    EngineError,
    EngineTimeoutError,
    InvalidAnswerError,
    classify_answer,
)
from snooze.engine.http import ANSWER_LIMIT, LEASE_SECONDS, Answer, EngineHttp, Sink
from snooze.engine.metricspath import Query
from snooze.engine.sglangfacts import PROBE_METRICS as SGLANG_METRICS
from snooze.engine.sglangfacts import SGLangActivityReader


class Prober:
    """Scrapes engines' `/metrics` (and `/is_sleeping`) for the operator's probes.

    One session for every engine (EngineHttp), at most `limit` requests at once, each holding
    its slot at most `lease` seconds. Every method raises only EngineError subclasses.
    """

    def __init__(
        self,
        *,
        limit: int = 64,
        timeout: float = 5.0,
        ssl_context: ssl.SSLContext | None = None,
        lease: float = LEASE_SECONDS,
    ) -> None:
        self.timeout = timeout
        self._http = EngineHttp(limit=limit, ssl_context=ssl_context, lease=lease)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def activity(
        self,
        base_url: str,
        *,
        share_known: bool = False,
        urgent: bool = False,
        owner: Hashable = None,
    ) -> ActivitySnapshot:
        """The engine's activity, from a filtered scrape (the whole page if the filter fails;
        engine/metricspath.py); `urgent` probes go before the others, and `owner`s (models)
        take turns (Turns)."""
        names = PROBE_METRICS if share_known else ACTIVITY_METRICS

        async def scrape(path: str, query: Query) -> ActivitySnapshot | None:
            return await self._scrape(base_url, path, query, urgent, owner)

        snapshot = await self._http.metrics_paths.activity(base_url, names, scrape)
        if snapshot is None:
            raise _unreadable(base_url, "/metrics", "no request gauges in the payload")
        return snapshot

    async def is_sleeping(
        self, base_url: str, *, urgent: bool = False, owner: Hashable = None
    ) -> bool:
        """For engines that do not publish vllm:engine_sleep_state (before vLLM 0.11.1)."""
        text = (await self._get(base_url, "/is_sleeping", None, urgent, owner)).text
        try:
            value = json.loads(text).get("is_sleeping")
        except (ValueError, AttributeError):
            value = None
        if not isinstance(value, bool):
            raise _unreadable(base_url, "/is_sleeping", 'expected {"is_sleeping": true|false}')
        return value

    async def _scrape(
        self, base_url: str, path: str, query: Query, urgent: bool, owner: Hashable
    ) -> ActivitySnapshot | None:
        # Read as it comes, a chunk at a time: nothing of the page is kept but the few values
        # a probe needs, however long the page (up to METRICS_LIMIT).
        reader = ActivityReader()
        try:
            await self._get(
                base_url, path, query, urgent, owner, limit=METRICS_LIMIT, sink=reader.feed
            )
            return reader.result()
        except ValueError as exc:
            raise _unreadable(base_url, path, str(exc)) from exc

    async def _get(
        self,
        base_url: str,
        path: str,
        query: list[tuple[str, str]] | None,
        urgent: bool = False,
        owner: Hashable = None,
        *,
        limit: int = ANSWER_LIMIT,
        sink: Sink | None = None,
    ) -> Answer:
        url = base_url + path
        # The timeout starts once the request has its turn (EngineHttp): aiohttp's own timeout
        # counted the wait for a pooled connection, and healthy engines were reported
        # unreachable (217 of 3,000 in one wave). It bounds the whole answer, not each chunk:
        # an engine that drips its answer a byte at a time is cut off at it.
        try:
            answer = await self._http.request(
                "GET",
                url,
                params=query,
                total=self.timeout,
                connect=self.timeout,
                urgent=urgent,
                owner=owner,
                limit=limit,
                sink=sink,
            )
        except TimeoutError as exc:
            raise EngineTimeoutError(
                f"{base_url} took longer than {self.timeout:g}s answering {path}.", url=url
            ) from exc
        if answer.status >= 300:
            raise classify_answer(answer.status, answer.text, url=url, path=path)
        return answer

    async def sglang_activity(
        self, base_url: str, *, urgent: bool = False, owner: Hashable = None
    ) -> ActivitySnapshot:
        """An SGLang server's activity (engine/sglangfacts.py), as `activity` reads vLLM's."""
        for query in ([("name[]", name) for name in SGLANG_METRICS], None):
            reader = SGLangActivityReader()
            try:
                await self._get(
                    base_url,
                    "/metrics",
                    query,
                    urgent,
                    owner,
                    limit=METRICS_LIMIT,
                    sink=reader.feed,
                )
                snapshot = reader.result()
            except ValueError as exc:
                raise _unreadable(base_url, "/metrics", str(exc)) from exc
            if snapshot is not None:
                return snapshot
        raise _unreadable(base_url, "/metrics", "no request gauges in the payload")


def _unreadable(base_url: str, path: str, what: str) -> EngineError:
    return InvalidAnswerError(
        f"{base_url}{path} answered something the operator cannot read or believe ({what}): "
        "it counts as no answer. Is this port a vLLM engine?",
        url=base_url + path,
        status=200,
        message=what,
    )
