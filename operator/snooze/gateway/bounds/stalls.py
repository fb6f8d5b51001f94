"""Engines that take requests and start none: asleep while the operator's view says awake (an
engine whose metrics lie), frozen, or wedged. Such an engine accepts connections and reads
requests, and answers nothing; without a bound of its own, each request waited out the
first-byte timeout (ten minutes).

An engine has started an answer when the first event of a stream comes (vLLM sends it after
the prompt's prefill and first token; its SSE comments do not count), or any answer that
comes whole. An engine that has started nothing for `--upstream-start-timeout` while a
stream waited on it all that time is stuck: every request waiting on it ends with a 502, and
it gets no request for AVOID_FIRST seconds, twice as long each time again up to AVOID_MOST,
until it answers. An engine busy with other requests is not stuck, however long one
request's prefill takes: anything it sends counts. A request that comes whole (not a stream)
cannot tell a long generation from a stuck engine, so when only such requests wait, the
gateway sends the engine one stream of its own (a one-token completion for the model those
requests name), and judges the engine by it.

The gateway never calls an engine's admin routes and trusts only the operator for what is
awake: it only stops sending for a while, and says so on its metrics page
(`snooze_gateway_pod_stalls_total`), which Prometheus reads, and the operator too: it probes
the engine at once, asking /is_sleeping, and relabels one it finds asleep. A pod the operator
relabels is judged afresh (`pardon`): what it said before explained the stall.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp
from yarl import URL

from snooze.gateway.bounds.interruptible import Interruptible
from snooze.gateway.metrics import GatewayMetrics

log = logging.getLogger(__name__)

FLAG = "--upstream-start-timeout"
AVOID_FIRST = 30.0
"""Seconds a stuck engine gets no request, the first time."""
AVOID_MOST = 600.0
"""The longest it gets none, after being found stuck again and again."""
PROBE_PATH = "/v1/completions"
# The routes whose models a one-token completion can stand for (a pooling model's routes,
# embeddings, rerank, score, have no completions: their requests are not probed for).
PROBED_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses"})
PROBE_LIMIT = 64 * 1024
"""The most of a probe's answer read before its first event."""
Key = tuple[str, str]
Probe = Callable[[], Awaitable[bool | None]]
"""Sends the engine a one-token stream: True once its first event came, None when its
answer cannot tell (refused, or not a stream)."""


class EngineStuck(Exception):
    """The engine started no answer for the start timeout while requests waited on it."""

    def __init__(self, seconds: float, avoid: float) -> None:
        super().__init__(
            f"it started no answer for {seconds:g}s ({FLAG}) while requests waited on it"
        )
        self.seconds = seconds
        self.avoid = avoid


@dataclass(eq=False)
class _Waiter:
    since: float
    stream: bool
    watch: Waiting
    probe: Probe | None


@dataclass(eq=False)
class _Engine:
    waiters: set[_Waiter] = field(default_factory=set)
    progress: float = -math.inf
    """When it last sent anything of a successful answer."""
    avoid_until: float = 0.0
    avoid_for: float = 0.0
    """How long it was last avoided for."""
    strikes: int = 0
    """Times found stuck since it last answered."""
    probe: asyncio.Task[None] | None = None
    no_probe_until: float = 0.0
    """A probe could not tell: none is sent until then."""
    users: int = 0
    """Requests to it under way, waiting or answered: each tells of its progress."""

    @property
    def idle(self) -> bool:
        return not self.users and self.probe is None


class Stalls:
    """The engines' starts, as this replica sees them, and which of them it avoids. One timer
    looks at the engines that have requests waiting, every quarter of the bound (a request
    costs no timer of its own): an engine is found stuck between one and one and a quarter
    bounds after it last sent anything."""

    def __init__(self, *, bound: float, metrics: GatewayMetrics) -> None:
        self.bound = bound
        self.metrics = metrics
        self._engines: dict[Key, _Engine] = {}
        self._waited_on: set[Key] = set()
        """The engines with requests waiting on them."""
        self._timer: asyncio.TimerHandle | None = None

    def avoided(self, key: Key) -> float:
        """Seconds the engine is still avoided for (0: it is not)."""
        engine = self._engines.get(key)
        if engine is None:
            return 0.0
        return max(0.0, engine.avoid_until - asyncio.get_running_loop().time())

    def pardon(self, namespace: str, pod: str) -> None:
        """The operator changed what it says of the engine (it found it asleep, or woke it):
        its stalls are explained, so it is no longer avoided, and a new stall counts as the
        first. Requests under way on it go on as they were."""
        engine = self._engines.get((namespace, pod))
        if engine is not None:
            engine.avoid_until, engine.avoid_for, engine.strikes = 0.0, 0.0, 0
            self._prune((namespace, pod), engine)

    def forget(self, namespace: str, pod: str) -> None:
        """A deleted pod."""
        self._engines.pop((namespace, pod), None)
        self._waited_on.discard((namespace, pod))

    def waiting(self, key: Key, *, stream: bool, probe: Probe | None = None) -> Waiting:
        """A request sent to engine `key` (`stream`: its answer is a stream), waiting for it
        to start its answer; `probe` stands in for it if it comes whole."""
        return Waiting(self, key, stream=stream, probe=probe)

    def _engine(self, key: Key) -> _Engine:
        engine = self._engines.get(key)
        if engine is None:
            engine = self._engines[key] = _Engine()
        return engine

    def _waits(self, key: Key, engine: _Engine, waiter: _Waiter) -> None:
        engine.waiters.add(waiter)
        self._waited_on.add(key)
        if self._timer is None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_at(loop.time() + self.bound / 4, self._look)

    def _left(self, key: Key, engine: _Engine, waiter: _Waiter) -> None:
        engine.waiters.discard(waiter)
        if not engine.waiters:
            self._waited_on.discard(key)

    def _done(self, key: Key, engine: _Engine) -> None:
        """A request to it is over."""
        engine.users -= 1
        self._prune(key, engine)

    def _prune(self, key: Key, engine: _Engine) -> None:
        """What is known of an engine nobody uses, that is not avoided, is forgotten."""
        now = asyncio.get_running_loop().time()
        unused = engine.idle and engine.strikes == 0 and engine.avoid_until <= now
        if unused and self._engines.get(key) is engine:
            del self._engines[key]

    def _look(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        for key in list(self._waited_on):
            engine = self._engines.get(key)
            if engine is None or not engine.waiters:
                self._waited_on.discard(key)
            else:
                self._check(key, engine, now)
        self._timer = loop.call_at(now + self.bound / 4, self._look) if self._waited_on else None

    def _check(self, key: Key, engine: _Engine, now: float) -> None:
        """Whether the engine has started nothing for a bound while a stream waited on it."""
        quiet = max(min(w.since for w in engine.waiters), engine.progress)
        if now < quiet + self.bound:
            return
        if any(
            w.stream and max(w.since, engine.progress) + self.bound <= now for w in engine.waiters
        ):
            self._stuck(key, engine, now)
            return
        # Only answers that come whole have waited that long: a stream of the gateway's own
        # tells whether the engine starts anything.
        probe = next((w.probe for w in engine.waiters if w.probe is not None), None)
        if probe is not None and engine.probe is None and engine.no_probe_until <= now:
            engine.probe = asyncio.get_running_loop().create_task(
                self._probe(key, engine, probe), name=f"probe-{key[0]}-{key[1]}"
            )

    def _stuck(self, key: Key, engine: _Engine, now: float) -> None:
        engine.strikes += 1
        avoid = min(AVOID_MOST, AVOID_FIRST * 2 ** (engine.strikes - 1))
        engine.avoid_until, engine.avoid_for = now + avoid, avoid
        waiters = list(engine.waiters)
        log.warning(
            "the engine of pod %s/%s started no answer for %gs (%s) while %d requests waited "
            "on it: they end with 502, and it gets no request for %gs",
            *key,
            self.bound,
            FLAG,
            len(waiters),
            avoid,
        )
        self.metrics.engine_stalled(*key)
        engine.waiters.clear()
        self._waited_on.discard(key)
        for waiter in waiters:
            waiter.watch.interrupt()

    async def _probe(self, key: Key, engine: _Engine, probe: Probe) -> None:
        now = asyncio.get_running_loop().time
        try:
            # Bounded on its own: an engine busy with others is not stuck, and a probe queued
            # behind them is given up on.
            async with asyncio.timeout(2 * self.bound), self.waiting(key, stream=True) as watch:
                told = await probe()
                if told:
                    watch.progress()
                else:
                    engine.no_probe_until = now() + AVOID_MOST
                    log.info("the probe of pod %s/%s could not tell whether it answers", *key)
        except (EngineStuck, TimeoutError, aiohttp.ClientError, OSError) as exc:
            log.debug("the probe of pod %s/%s ended: %r", *key, exc)
        finally:
            engine.probe = None
            self._prune(key, engine)


class Waiting(Interruptible):
    """One request waiting for its engine to start its answer (an async context manager
    around everything that follows its sending): the engine found stuck meanwhile cancels
    it, and it leaves with EngineStuck."""

    def __init__(self, stalls: Stalls, key: Key, *, stream: bool, probe: Probe | None) -> None:
        self.stalls = stalls
        self.key = key
        self.stream = stream
        self.probe = probe
        self._engine: _Engine | None = None
        self._waiter: _Waiter | None = None

    def _enter(self) -> None:
        stalls = self.stalls
        engine = self._engine = stalls._engine(self.key)
        now = asyncio.get_running_loop().time()
        self._waiter = _Waiter(now, self.stream, self, self.probe)
        engine.users += 1
        stalls._waits(self.key, engine, self._waiter)

    def _leave(self) -> None:
        assert self._engine is not None
        self.started()
        self.stalls._done(self.key, self._engine)

    def _error(self) -> Exception:
        assert self._engine is not None
        return EngineStuck(self.stalls.bound, self._engine.avoid_for)

    def progress(self) -> None:
        """The engine sent something of a successful answer: it is not stuck."""
        engine = self._engine
        assert engine is not None
        engine.progress = asyncio.get_running_loop().time()
        engine.strikes = 0
        self.started()

    def started(self) -> None:
        """The request has its answer under way (or an error): it waits no more."""
        waiter, engine = self._waiter, self._engine
        if waiter is not None and engine is not None and waiter in engine.waiters:
            self.stalls._left(self.key, engine, waiter)


async def probe_engine(
    session: aiohttp.ClientSession, url: URL, model: str, authorization: str | None
) -> bool | None:
    """A one-token stream for `model` at `url`: True once its first event comes, None when
    the engine refuses it or answers otherwise (it may serve no completions)."""
    body = {"model": model, "prompt": "ping", "max_tokens": 1, "stream": True}
    headers = {"Authorization": authorization} if authorization else {}
    async with session.post(url, json=body, headers=headers) as answer:
        if answer.status != 200 or answer.content_type != "text/event-stream":
            return None
        read = 0
        while chunk := await answer.content.readany():
            if b"data:" in chunk:
                return True
            read += len(chunk)
            if read > PROBE_LIMIT:
                return None
    return None
