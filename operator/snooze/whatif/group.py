"""The clock of a whatif simulation: the models that share one (a model on devices of its own,
or a pool's members on theirs), driven from event to event: a request arriving, an engine's
sleep, wake or start ending, a deadline passing. A request that an awake model only serves
asks for no decision, so a busy model costs a few microseconds a request; and what it counts
in devices held."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import count

from snooze.whatif.model import EPSILON, ModelSim
from snooze.whatif.pooling import PoolSim

ROUNDS = 64
"""Decisions at one instant, at most: a model acts on what its pool decided, the pool on what
the models did, until neither has anything new (a few rounds; the bound only guards)."""
ALL = -1


@dataclass(kw_only=True)
class Devices:
    """Devices held over the measured span: their seconds, and when their count changed."""

    seconds: float = 0.0
    start: int = 0
    """Held at the span's start."""
    changes: list[tuple[float, int]] = field(default_factory=list)


class Group:
    """Models on one clock: `run` replays their requests and returns what their devices held."""

    def __init__(
        self, models: Sequence[ModelSim], *, pool: PoolSim | None, start: float, end: float
    ) -> None:
        self.models = list(models)
        self.pool = pool
        self.start = start
        self.end = max([end, *(m.end for m in self.models)])
        self._queue: list[tuple[float, int, str, int, int]] = []
        self._seq = count()
        self._timers: set[tuple[float, int]] = set()
        self._position = {m.index: k for k, m in enumerate(self.models)}
        for model in self.models:
            model.clock = self
            model.end = self.end

    def push(self, at: float, kind: str, model: int, engine: int) -> None:
        heapq.heappush(self._queue, (at, next(self._seq), kind, model, engine))

    def timer(self, at: float, model: int = ALL) -> None:
        if (at, model) not in self._timers:  # one look per instant, however many ask
            self._timers.add((at, model))
            self.push(at, "timer", model, -1)

    def _local(self, model: int) -> int:
        return self._position[model]

    def run(self) -> Devices:
        models = self.models
        cursor = [0] * len(models)
        arrivals = [(m.requests.at[0], k) for k, m in enumerate(models)]
        heapq.heapify(arrivals)
        for model in models:
            for edge in model.edges():
                self.timer(edge + EPSILON, model.index)
        self._cycle(self.start, set(range(len(models))))
        queue = self._queue
        while arrivals or queue:
            if arrivals and (not queue or arrivals[0][0] <= queue[0][0]):
                now, k = arrivals[0]
                i = cursor[k]
                cursor[k] = i + 1
                column = models[k].requests.at
                if i + 1 < len(column):
                    heapq.heapreplace(arrivals, (column[i + 1], k))
                else:
                    heapq.heappop(arrivals)
                if models[k].arrive(i, now):
                    self._cycle(now, {k})
                continue
            now, _, kind, index, engine = heapq.heappop(queue)
            if now > self.end:
                # Past the last arrival, only the answers still owed count: those that ended
                # by now extend the span to their end; one still owed, to now.
                ended = [t for m in models for e in m.engines for t in e.ends if t <= now]
                for model in models:
                    model.retire(now, inclusive=False)
                owed = any(m.owes() for m in models)
                self._extend(now if owed else max(ended, default=self.end))
                if not owed:
                    break
            if kind == "timer":
                self._timers.discard((now, index))
                self._cycle(now, set() if index == ALL else {self._local(index)})
            else:
                k = self._local(index)
                models[k].event(kind, models[k].engines[engine], now)
                self._cycle(now, {k})
        # The answers still owed when nothing else happens end the span.
        self._extend(max((t for m in models for e in m.engines for t in e.ends), default=0.0))
        return self._devices()

    def _extend(self, end: float) -> None:
        if end > self.end:
            self.end = end
            for model in self.models:
                model.end = end

    def _cycle(self, now: float, touched: set[int]) -> None:
        """The operator's look at `now`: the touched models decide, then their pool, then the
        models it told something new, until nothing changes."""
        looked = set(touched)
        for _ in range(ROUNDS):
            acted = False
            for k in sorted(touched):
                acted = self.models[k].cycle(now) or acted
            if self.pool is None:
                break
            told = {self._local(i) for i in self.pool.decide(now)}
            if not acted and not told:
                break
            touched = told | (touched if acted else set())
            looked |= touched
        for k in looked:
            at = self.models[k].next_look(now)
            if at is not None:
                self.timer(at, self.models[k].index)
        if self.pool is not None:
            at = self.pool.next_look(now)
            if at is not None:
                self.timer(at)

    def _devices(self) -> Devices:
        """A pool's device is held while the pool has a member; a model's own devices while
        its pods exist (a pod scaled to zero gives its device back; one starting holds it)."""
        begin = max(self.start, min(m.measure_from for m in self.models))
        end = self.end
        if self.pool is not None:
            return Devices(seconds=max(end - begin, 0.0), start=1)
        model = self.models[0]
        held, at = len(model.engines), self.start
        devices = Devices(start=held)
        for when, change in model.device_changes:
            low, high = max(at, begin), min(when, end)
            if high > low:
                devices.seconds += held * (high - low)
            held, at = held + change, when
            if when <= begin:
                devices.start += change
            elif when <= end:
                devices.changes.append((when, change))
        if end > max(at, begin):
            devices.seconds += held * (end - max(at, begin))
        return devices


def peak(groups: Sequence[Devices]) -> int:
    """The most devices held at once over the measured span."""
    held = sum(g.start for g in groups)
    best = held
    changes = sorted((when, change) for g in groups for when, change in g.changes)
    for _, change in changes:
        held += change
        best = max(best, held)
    return best
