"""Probes of many engines over one aiohttp session: the operator's most frequent request, made
cheap (about half the CPU of an httpx request, measured in benchmarks/scrape.py)."""

from __future__ import annotations

import asyncio
import json
import ssl

import aiohttp

from snooze.engine.activity import ACTIVITY_METRICS, PROBE_METRICS, ActivitySnapshot, parse_activity
from snooze.engine.errors import (
    EngineError,
    EngineHTTPError,
    EngineTimeoutError,
    EngineUnreachableError,
    classify_answer,
)


class Prober:
    """Scrapes engines' `/metrics` (and `/is_sleeping`) for the operator's probes.

    One session for every engine, at most `limit` requests at once. Connections are not kept
    alive: an engine is probed again only after seconds, by when vLLM's server has closed an
    idle one (after 5 s). Every method raises only EngineError subclasses.
    """

    def __init__(
        self, *, limit: int = 64, timeout: float = 5.0, ssl_context: ssl.SSLContext | None = None
    ) -> None:
        self.limit = limit
        self.timeout = timeout
        self._ssl = ssl_context
        self._session: aiohttp.ClientSession | None = None
        self._slots: asyncio.Semaphore | None = None
        self._unfiltered: set[str] = set()
        """Engines whose `name[]` filter finds nothing (vLLM with several API servers uses the
        multiprocess collector, which the filter cannot see): scraped whole."""

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit=self.limit, force_close=True, ssl=self._ssl if self._ssl is not None else True
            )
            # The deadline is _get's, started once a slot is held.
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=None)
            )
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def activity(self, base_url: str, *, share_known: bool = False) -> ActivitySnapshot:
        """The engine's activity, from a filtered scrape (the whole page if the filter fails)."""
        if base_url not in self._unfiltered:
            names = PROBE_METRICS if share_known else ACTIVITY_METRICS
            query = [("name[]", name) for name in names]
            snapshot = parse_or_raise(await self._get(base_url, "/metrics", query), base_url)
            if snapshot is not None:
                return snapshot
        snapshot = parse_or_raise(await self._get(base_url, "/metrics", None), base_url)
        if snapshot is None:
            raise _unreadable(base_url, "/metrics", "no request gauges in the payload")
        self._unfiltered.add(base_url)  # only a whole page with the gauges blames the filter
        return snapshot

    async def is_sleeping(self, base_url: str) -> bool:
        """For engines that do not publish vllm:engine_sleep_state (before vLLM 0.11.1)."""
        text = await self._get(base_url, "/is_sleeping", None)
        try:
            value = json.loads(text).get("is_sleeping")
        except (ValueError, AttributeError):
            value = None
        if not isinstance(value, bool):
            raise _unreadable(base_url, "/is_sleeping", 'expected {"is_sleeping": true|false}')
        return value

    async def _get(self, base_url: str, path: str, query: list[tuple[str, str]] | None) -> str:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.limit)
        # The timeout starts once the request has its slot: a queue of probes (thousands of
        # models probing at once, an operator busy with a sleep wave) is the operator's delay,
        # not the engine's. aiohttp's own timeout counted the wait for a pooled connection,
        # and healthy engines were reported unreachable (217 of 3,000 in one wave).
        async with self._slots:
            return await self._get_now(base_url, path, query)

    async def _get_now(self, base_url: str, path: str, query: list[tuple[str, str]] | None) -> str:
        url = base_url + path
        try:
            async with (
                asyncio.timeout(self.timeout),
                self._client().get(url, params=query) as response,
            ):
                text = await response.text()
        except aiohttp.ClientConnectorError as exc:
            raise EngineUnreachableError(
                f"cannot connect to {url}: {exc}. The pod may be starting, gone or dead; check "
                "that it runs and that the operator may reach its port (NetworkPolicy).",
                url=url,
            ) from exc
        except TimeoutError as exc:
            raise EngineTimeoutError(
                f"{base_url} took longer than {self.timeout:g}s answering {path}.", url=url
            ) from exc
        except (aiohttp.ClientError, asyncio.IncompleteReadError) as exc:
            raise EngineUnreachableError(
                f"the connection to {url} broke before a whole answer: "
                f"{exc or type(exc).__name__}. The engine may have crashed; check the pod.",
                url=url,
            ) from exc
        if response.status >= 300:
            raise classify_answer(response.status, text, url=url, path=path)
        return text


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
