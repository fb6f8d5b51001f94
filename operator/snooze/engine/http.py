"""The operator's HTTP to engines (its probes, and its sleeps and wakes, each on a session of
its own): aiohttp, a bounded number of requests at once, each request timed from its turn and
read up to a bound, every transport failure turned into an EngineError, and, for probes, no
slot held long by an engine that answers slowly.

aiohttp, not httpx: in a sleep wave of 2,500 engines, httpx's requests (a sleep, a drain check
and a confirmation per engine) were a third of the operator's CPU, most of it anyio's cancel
scopes and httpcore's pool (benchmarks/README.md); aiohttp is kopf's own client.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

import aiohttp
import yarl

from snooze.engine.errors import AnswerTooLargeError, EngineUnreachableError
from snooze.engine.metricspath import MetricsPaths
from snooze.engine.turns import Turn, Turns

Params = dict[str, Any] | list[tuple[str, str]] | None
Sink = Callable[[bytes], None]
# The most read of an answer that is not a metrics page: vLLM's admin answers are a JSON
# object of a few dozen bytes, its errors a message; a traceback fits many times over.
ANSWER_LIMIT = 64 * 1024
# How long a probe may hold its slot among the probes' shared ones: a healthy engine answers a
# probe in milliseconds. Past it the request gives its slot back and finishes without one, and
# its engine's next requests wait for slots of their own (the slow lane), until one of them is
# answered within this again: engines that drip their answers a byte at a time, or that
# never answer, then delay nobody but each other.
LEASE_SECONDS = 0.5
# Engines remembered as slow: ten thousand fit many times over; the oldest are forgotten first.
SLOW_REMEMBERED = 65536
# Requests past their lease that may go on without a slot, in slots' worth: past that, one
# keeps its slot until others are done. On an operator too busy to read its answers within
# the lease, every request overruns it: this keeps the requests out at once bounded (at five
# times the slots, counting the slow lane's), as the slots alone did before.
OVERTIME = 4
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


class TooLarge(Exception):
    """An answer went on past the most its reader takes."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"more than {size(limit)}")
        self.limit = limit


async def read_bounded(
    response: aiohttp.ClientResponse, *, limit: int, sink: Sink | None = None
) -> bytes:
    """The body of `response`, never more than `limit` bytes of it (decompressed): TooLarge
    past them, at once when its Content-Length says so. With `sink`, each chunk goes there as
    it comes and nothing is kept (the answer is b""); what `sink` raises ends the read.
    The caller bounds the time."""
    length = None if "Content-Encoding" in response.headers else response.content_length
    if length is not None and length > limit:
        raise TooLarge(limit)
    if length is not None and length <= ANSWER_LIMIT:
        # Small and of a known length (a probe's filtered page): read at once, as it fits.
        body = await response.read()
        if sink is None:
            return body
        sink(body)
        return b""
    kept = bytearray()
    read = 0
    async for chunk in response.content.iter_any():
        read += len(chunk)
        if read > limit:
            raise TooLarge(limit)
        if sink is None:
            kept += chunk
        else:
            sink(chunk)
    return bytes(kept)


def size(count: int) -> str:
    """A byte count as people read it: 64 KiB, 8 MiB."""
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if count >= 1 << shift and count % (1 << shift) == 0:
            return f"{count >> shift} {unit}"
    return f"{count} bytes"


class EngineHttp:
    """Requests to many engines over one session, at most `limit` at once (the others wait
    their turn in O(1), the urgent ones first), each answer read up to a bound.

    With a `lease` (the probes' session), a request holds its slot at most that long: one
    still unanswered then gives it back and goes on without (up to OVERTIME slots' worth of
    such requests), and its engine is slow from then on: its requests take turns among
    `limit` slots of their own until one is answered within the lease again. Without one
    (sleeps and wakes, which take as long as the engine needs), a request holds its slot until
    it is answered or times out.

    A connection is kept for `KEEPALIVE_SECONDS` after its request, for the next request of
    the same step (opening a TCP connection per request was a sixth of a sleep wave's CPU).
    Use it as an async context manager, or call `aclose`.
    """

    def __init__(
        self,
        *,
        limit: int = 64,
        ssl_context: ssl.SSLContext | None = None,
        lease: float | None = None,
    ) -> None:
        self.limit = limit
        self.lease = lease
        self._ssl = ssl_context
        self._session: aiohttp.ClientSession | None = None
        self._turns = Turns(limit)
        self._slow_turns = Turns(limit)
        self._slow: OrderedDict[str, None] = OrderedDict()
        """Engines (host:port) whose last request overran its lease, or was too large."""
        self.overtime = 0
        """Requests past their lease, going on without a slot."""
        self.metrics_paths = MetricsPaths()
        """Which metrics path of each engine filters, as its answers over this session showed."""

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

    def is_slow(self, url: str) -> bool:
        """Whether requests to this engine take their turns in the slow lane."""
        return _engine_of(_parsed(url, ())) in self._slow

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
        owner: Hashable = None,
        limit: int = ANSWER_LIMIT,
        sink: Sink | None = None,
    ) -> Answer:
        """Send one request and read its whole answer within `total` seconds of its turn
        (connecting within `connect`), at most `limit` bytes of it; `urgent` requests take
        their turn before the others, and `owner`s take turns in rotation (Turns). With
        `sink`, a 2xx answer's body goes there chunk by chunk and the Answer's body is empty
        (what `sink` raises ends the request); another status's body is kept for its error
        (up to ANSWER_LIMIT). Raises EngineUnreachableError when the engine cannot be reached
        or the connection breaks, AnswerTooLargeError past `limit`, and TimeoutError (for the
        caller to word) when the answer takes too long; an answer of any status is returned."""
        if isinstance(params, dict):
            target = _parsed(url, ())  # aiohttp adds the params
        else:
            target, params = _parsed(url, tuple(params or ())), None
        engine = _engine_of(target)
        slow = self.lease is not None and engine in self._slow
        # The deadline starts once the request has its slot: a queue of requests (thousands of
        # models at once, an operator busy with a sleep wave) is the operator's delay, not the
        # engine's, and a healthy engine must not be reported unreachable for it.
        turns = self._slow_turns if slow else self._turns
        async with turns.turn(urgent=urgent, owner=owner) as turn:
            began = asyncio.get_running_loop().time()
            lease = _Lease(self, turn, engine) if self.lease is not None and not slow else None
            try:
                answer = await self._send(
                    method,
                    url,
                    target,
                    total=total,
                    connect=connect,
                    params=params,
                    json=json,
                    limit=limit,
                    sink=sink,
                )
            except (TimeoutError, AnswerTooLargeError):
                self.note_slow(engine)
                raise
            finally:
                if lease is not None:
                    lease.end()
            if self.lease is not None and asyncio.get_running_loop().time() - began <= self.lease:
                self._slow.pop(engine, None)
            return answer

    async def _send(
        self,
        method: str,
        url: str,
        target: yarl.URL,
        *,
        total: float,
        connect: float,
        params: Params,
        json: Any,
        limit: int,
        sink: Sink | None,
    ) -> Answer:
        try:
            async with (
                asyncio.timeout(total),  # the whole answer, not each chunk of it
                self._client().request(
                    method,
                    target,
                    params=params,
                    json=json,
                    timeout=aiohttp.ClientTimeout(total=None, connect=connect),
                ) as response,
            ):
                if not 200 <= response.status < 300:
                    limit, sink = min(limit, ANSWER_LIMIT), None  # kept for its message
                try:
                    body = await read_bounded(response, limit=limit, sink=sink)
                except TooLarge as exc:
                    raise AnswerTooLargeError(
                        f"{url} answered {response.status} with {exc} (the most the operator "
                        "reads of an engine's answer there): it counts as no answer. Check that "
                        "this port is a vLLM engine's.",
                        url=url,
                        status=response.status,
                        message=f"an answer of {exc}",
                    ) from None
                return Answer(response.status, body)
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

    def note_slow(self, engine: str) -> None:
        """From now on, requests to `engine` (host:port) take their turns in the slow lane."""
        if self.lease is None:
            return
        self._slow[engine] = None
        self._slow.move_to_end(engine)
        while len(self._slow) > SLOW_REMEMBERED:
            self._slow.popitem(last=False)


class _Lease:
    """A request's hold on a shared slot, given back when the lease runs out (the request goes
    on without it, and its engine is slow from then on), as long as fewer than OVERTIME slots'
    worth of requests are out without one; else it is kept, and asked for again a lease later."""

    def __init__(self, http: EngineHttp, turn: Turn, engine: str) -> None:
        assert http.lease is not None
        self._http, self._turn, self._engine = http, turn, engine
        self._loop = asyncio.get_running_loop()
        self._timer = self._loop.call_later(http.lease, self._run_out)
        self._over = False

    def _run_out(self) -> None:
        http = self._http
        http.note_slow(self._engine)
        if http.overtime >= OVERTIME * http.limit:
            assert http.lease is not None
            self._timer = self._loop.call_later(http.lease, self._run_out)
            return
        http.overtime += 1
        self._over = True
        self._turn.give_back()

    def end(self) -> None:
        self._timer.cancel()
        if self._over:
            self._http.overtime -= 1


@functools.lru_cache(maxsize=16384)
def _engine_of(target: yarl.URL) -> str:
    return f"{target.host}:{target.port}"


def _describe(error: Exception) -> str:
    # Some errors carry an empty message; the class name still says what happened.
    return str(error) or type(error).__name__
