"""The operator's HTTP to engines (its probes, and its sleeps and wakes, each on a session of
its own): aiohttp, a bounded number of requests at once, each request timed from its turn,
and every transport failure turned into an EngineError.

aiohttp, not httpx: in a sleep wave of 2,500 engines, httpx's requests (a sleep, a drain check
and a confirmation per engine) were a third of the operator's CPU, most of it anyio's cancel
scopes and httpcore's pool (benchmarks/README.md); aiohttp is kopf's own client.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ssl
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

import aiohttp
import yarl

from snooze.engine.errors import EngineUnreachableError

Params = dict[str, Any] | list[tuple[str, str]] | None
# How long an idle connection to an engine is kept for the next request: the requests of one
# step come together (a probe, a drain check, the sleep, its confirmation; a wake's stages),
# then nothing for seconds. Well under vLLM's own keep-alive (5 s), so that the engine never
# closes a connection just as it is taken again.
KEEPALIVE_SECONDS = 2.0


# Parsed URLs by text and query. An engine's probe URL is asked for again every interval, and
# parsing it (its host checked as an IP address, the query encoded) was 9% of the operator's
# CPU in a 10,000-engine start-up and 5% in its sleep wave. Bounded: ten thousand engines'
# probe URLs fit, about 0.7 kB each; a sleep wave's other URLs only push some out.
@functools.lru_cache(maxsize=16384)
def _parsed(url: str, query: tuple[tuple[str, str], ...]) -> yarl.URL:
    return yarl.URL(url).extend_query(query) if query else yarl.URL(url)


class Turns:
    """At most `limit` holders at once; waiters marked urgent take their turn before the others,
    each kind first come, first served.

    Urgent requests are those a decision is blocked on: the first probe of an engine that has
    never answered, which stays unlabelled (so the gateway sends it nothing) until it does. At
    start-up, the first probes of ten thousand engines otherwise wait behind the routine probes
    of the engines already labelled, which come round every interval.
    """

    def __init__(self, limit: int) -> None:
        self._free = limit
        self._urgent: deque[asyncio.Future[None]] = deque()
        self._routine: deque[asyncio.Future[None]] = deque()

    @contextlib.asynccontextmanager
    async def turn(self, *, urgent: bool = False) -> AsyncIterator[None]:
        await self._take(urgent)
        try:
            yield
        finally:
            self._give_back()

    async def _take(self, urgent: bool) -> None:
        if self._free > 0 and not self._urgent and not self._routine:
            self._free -= 1
            return
        queue = self._urgent if urgent else self._routine
        turn = asyncio.get_running_loop().create_future()
        queue.append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            # A waiter cancelled before its turn stays queued, skipped by _give_back (which
            # empties the queues of such waiters before a turn goes free): O(1) either way.
            if not turn.cancelled():
                self._give_back()  # given its turn, then cancelled: the next waiter has it
            raise

    def _give_back(self) -> None:
        for queue in (self._urgent, self._routine):
            while queue:
                turn = queue.popleft()
                if not turn.done():
                    turn.set_result(None)
                    return
        self._free += 1


@dataclass(frozen=True)
class Answer:
    """An engine's whole answer to one request."""

    status: int
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    @property
    def is_success(self) -> bool:
        return 200 <= self.status < 300


class EngineHttp:
    """Requests to many engines over one session, at most `limit` at once (the others wait
    their turn in O(1), the urgent ones first).

    A connection is kept for `KEEPALIVE_SECONDS` after its request, for the next request of
    the same step (opening a TCP connection per request was a sixth of a sleep wave's CPU).
    Use it as an async context manager, or call `aclose`.
    """

    def __init__(self, *, limit: int = 64, ssl_context: ssl.SSLContext | None = None) -> None:
        self.limit = limit
        self._ssl = ssl_context
        self._session: aiohttp.ClientSession | None = None
        self._turns = Turns(limit)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit=0,
                keepalive_timeout=KEEPALIVE_SECONDS,
                ssl=self._ssl if self._ssl is not None else True,
            )
            # Deadlines are request()'s, started once a slot is held.
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=None)
            )
        return self._session

    async def request(
        self,
        method: str,
        url: str,
        *,
        total: float,
        connect: float,
        params: Params = None,
        json: Any = None,
        urgent: bool = False,
    ) -> Answer:
        """Send one request and read its whole answer within `total` seconds of its turn
        (connecting within `connect`); `urgent` requests take their turn before the others.
        Raises EngineUnreachableError when the engine cannot be reached or the connection
        breaks, and TimeoutError (for the caller to word) when the answer takes too long; an
        answer of any status is returned."""
        if isinstance(params, dict):
            target = _parsed(url, ())  # aiohttp adds the params
        else:
            target, params = _parsed(url, tuple(params or ())), None
        # The deadline starts once the request has its slot: a queue of requests (thousands of
        # models at once, an operator busy with a sleep wave) is the operator's delay, not the
        # engine's, and a healthy engine must not be reported unreachable for it.
        async with self._turns.turn(urgent=urgent):
            try:
                async with (
                    asyncio.timeout(total),
                    self._client().request(
                        method,
                        target,
                        params=params,
                        json=json,
                        timeout=aiohttp.ClientTimeout(total=None, connect=connect),
                    ) as response,
                ):
                    return Answer(response.status, await response.read())
            except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
                raise EngineUnreachableError(
                    f"cannot connect to {url}: {_describe(exc)}. The pod may be starting, gone "
                    "or dead; check that it runs and that the operator may reach its port "
                    "(NetworkPolicy).",
                    url=url,
                ) from exc
            except TimeoutError:
                raise  # before ClientError: aiohttp's read timeouts are both
            except (aiohttp.ClientError, asyncio.IncompleteReadError) as exc:
                raise EngineUnreachableError(
                    f"the connection to {url} broke before a whole answer: {_describe(exc)}. "
                    "The engine may have crashed or restarted; check the pod.",
                    url=url,
                ) from exc


def _describe(error: Exception) -> str:
    # Some errors carry an empty message; the class name still says what happened.
    return str(error) or type(error).__name__
