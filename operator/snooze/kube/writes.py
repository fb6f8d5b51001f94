"""The operator's writes to the API, shared fairly between namespaces (tenants).

Every write waits for a turn. Namespaces take turns, one write each, so that a tenant whose
models churn cannot make another wait behind a queue of its writes; a wake's writes (its pod's
labels, the status that publishes it, a drain it cancels) go before every other write, in
turns too. Each namespace also has a budget, a token bucket whose size and rate grow with its
models: `per_model_per_minute` writes a minute for each model, in bursts of up to
`burst_per_model` each. A namespace over its budget waits for its next token; a wake's writes
may run one burst into debt first (a namespace's wakes are the last writes to wait on its
churn), so that what a namespace writes over any span is bounded by its budget and two bursts
(one saved, one of debt). Writes beyond `concurrency` at once queue here, not in the
API client's slots, so that the turns decide who goes next.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import re
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass

_URGENT: contextvars.ContextVar[bool] = contextvars.ContextVar("snooze_urgent_write", default=False)
_NAMESPACE = re.compile(r"/namespaces/([^/]+)/")


@contextlib.contextmanager
def urgent() -> Iterator[None]:
    """The writes made within (in this task) publish a wake: they go first."""
    token = _URGENT.set(True)
    try:
        yield
    finally:
        _URGENT.reset(token)


def is_urgent() -> bool:
    return _URGENT.get()


def namespace_of(path: str) -> str:
    """The namespace a write's path is in ("" for a cluster-wide object)."""
    found = _NAMESPACE.search(path)
    return found.group(1) if found else ""


class WriteYielded(Exception):
    """A write that gave way before its turn came: nothing was written."""


async def _first(waiter: asyncio.Future[None], event: asyncio.Event) -> None:
    """Until `waiter` is done or `event` is set."""
    if event.is_set():
        return
    setting = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait((waiter, setting), return_when=asyncio.FIRST_COMPLETED)
    finally:
        setting.cancel()


@dataclass
class _Bucket:
    tokens: float
    at: float
    models: int


class FairWrites:
    """Turns for writes: namespaces in turn, a wake's writes first, each namespace on its
    budget (see the module's docstring)."""

    def __init__(
        self,
        *,
        per_model_per_minute: float,
        burst_per_model: float,
        models: Callable[[str], int] = lambda namespace: 1,
        concurrency: int = 32,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.per_model_per_minute = per_model_per_minute
        self.burst_per_model = burst_per_model
        self.models = models
        """How many models a namespace has (its budget's weight; at least one counts)."""
        self.concurrency = concurrency
        self.clock = clock
        self.running = 0
        self._waiting: dict[bool, dict[str, deque[asyncio.Future[None]]]] = {True: {}, False: {}}
        self._buckets: dict[str, _Bucket] = {}
        self._timer: asyncio.TimerHandle | None = None
        self.waited = 0
        """Writes that waited for a token (for tests and metrics)."""

    @contextlib.asynccontextmanager
    async def turn(
        self, namespace: str, *, urgent: bool, yield_to: asyncio.Event | None = None
    ) -> AsyncIterator[None]:
        """Hold a turn for one write of `namespace` (with its retries). A write that waits
        gives way when `yield_to` is set before its turn comes (WriteYielded: nothing was
        written), so that a model's loop or a drain stuck behind its namespace's budget hears
        a wake at once."""
        if (
            not self._queued()
            and self.running < self.concurrency
            and self._affords(namespace, urgent)
        ):
            self._take(namespace)
        else:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiting[urgent].setdefault(namespace, deque()).append(waiter)
            if not urgent and not self._has_token(namespace):
                self.waited += 1
            try:
                self._dispatch()
                if yield_to is None:
                    await waiter
                else:
                    await _first(waiter, yield_to)
                    if not waiter.done():
                        self._forget(namespace, urgent, waiter)
                        waiter.cancel()
                        raise WriteYielded(f"a write to {namespace or 'the cluster'} gave way")
            except WriteYielded:
                raise
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._done()  # it had its turn: give it back
                else:
                    self._forget(namespace, urgent, waiter)
                raise
        try:
            yield
        finally:
            self._done()

    def _done(self) -> None:
        self.running -= 1
        self._dispatch()

    def _queued(self) -> bool:
        return any(self._waiting[True].values()) or any(self._waiting[False].values())

    def _forget(self, namespace: str, urgent: bool, waiter: asyncio.Future[None]) -> None:
        queue = self._waiting[urgent].get(namespace)
        if queue is not None and waiter in queue:
            queue.remove(waiter)
            if not queue:
                del self._waiting[urgent][namespace]

    def _bucket(self, namespace: str) -> _Bucket:
        """The namespace's bucket, refilled to now."""
        models = max(1, self.models(namespace))
        size = self.burst_per_model * models
        rate = self.per_model_per_minute * models / 60.0
        now = self.clock()
        bucket = self._buckets.get(namespace)
        if bucket is None:
            bucket = self._buckets[namespace] = _Bucket(tokens=size, at=now, models=models)
        if models > bucket.models:
            # A new model comes with its own burst (a namespace's models are created one by
            # one, and the first writes must not spend the burst of those still to come).
            bucket.tokens += self.burst_per_model * (models - bucket.models)
        bucket.models = models
        bucket.tokens = min(size, bucket.tokens + (now - bucket.at) * rate)
        bucket.at = now
        return bucket

    def _has_token(self, namespace: str) -> bool:
        return self._missing(namespace, urgent=False) <= 0

    def _missing(self, namespace: str, *, urgent: bool) -> float:
        """Tokens the namespace lacks for its next write (0 or less: none). A wake's write may
        take the bucket down to one burst below zero (the namespace's other writes then wait
        the longer); past that, it waits too: the namespace spends its own budget."""
        if self.per_model_per_minute <= 0:
            return 0.0  # no budget
        floor = -self.burst_per_model * max(1, self.models(namespace)) if urgent else 0.0
        return floor + 1.0 - self._bucket(namespace).tokens

    def _affords(self, namespace: str, urgent: bool) -> bool:
        return self._missing(namespace, urgent=urgent) <= 0

    def _take(self, namespace: str) -> None:
        self._bucket(namespace).tokens -= 1.0
        self.running += 1

    def _dispatch(self) -> None:
        """Give free turns to waiting writes: a wake's first, namespaces in turn."""
        while self.running < self.concurrency:
            picked = self._next(urgent=True) or self._next(urgent=False)
            if picked is None:
                break
            namespace, waiter = picked
            self._take(namespace)
            waiter.set_result(None)
        self._arm()

    def _next(self, *, urgent: bool) -> tuple[str, asyncio.Future[None]] | None:
        queues = self._waiting[urgent]
        for namespace in list(queues):
            queue = queues[namespace]
            while queue and queue[0].done():  # cancelled while waiting
                queue.popleft()
            if not queue:
                del queues[namespace]
                continue
            if not self._affords(namespace, urgent):
                continue
            waiter = queue.popleft()
            # Its namespace goes to the back of the line: the next turn is another's.
            del queues[namespace]
            if queue:
                queues[namespace] = queue
            return namespace, waiter
        return None

    def _arm(self) -> None:
        """Wake the dispatcher when the first waiting namespace over budget gets a token."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        waiting = [
            (namespace, urgent)
            for urgent, queues in self._waiting.items()
            for namespace, queue in queues.items()
            if queue
        ]
        if not waiting or self.running >= self.concurrency or self.per_model_per_minute <= 0:
            return
        delays = []
        for namespace, urgent in waiting:
            models = max(1, self.models(namespace))
            rate = self.per_model_per_minute * models / 60.0
            missing = self._missing(namespace, urgent=urgent)
            delays.append(missing / rate if rate > 0 else 60.0)
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(max(min(delays), 0.001), self._dispatch)
