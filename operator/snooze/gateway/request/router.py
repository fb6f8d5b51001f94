"""Picks the awake pod with the fewest requests in flight, and counts those requests."""

from __future__ import annotations

import itertools
import time
from collections.abc import Hashable, Iterator, Sequence
from contextlib import contextmanager

from snooze.kube.pods import PodInfo

PodKey = tuple[str, str]


def pick(pods: Sequence[PodInfo], in_flight: dict[PodKey, int], turn: int) -> PodInfo | None:
    """Pure: the least-loaded pod; ties rotate with `turn` so idle pods share the work."""
    if not pods:
        return None
    ordered = sorted(pods, key=lambda p: (p.namespace, p.name))
    offset = turn % len(ordered)
    rotated = ordered[offset:] + ordered[:offset]
    return min(rotated, key=lambda p: in_flight.get((p.namespace, p.name), 0))


class Router:
    """In-flight counts per pod, and pods recently unreachable, for this gateway replica."""

    def __init__(self, *, shun_seconds: float = 5.0) -> None:
        self.in_flight: dict[PodKey, int] = {}
        self.shun_seconds = shun_seconds
        self._unreachable: dict[PodKey, float] = {}
        self._turns: dict[Hashable, itertools.count[int]] = {}

    def choose(self, pods: Sequence[PodInfo], model: Hashable = None) -> PodInfo | None:
        """The least-loaded pod, preferring those not found unreachable of late.

        Ties take turns per model: with one counter for all models, a model's requests fell
        on its pods as the other models' traffic happened to interleave, and a pod could go
        without requests for long enough to be slept while its model was busy.
        A dead pod keeps its awake label until the operator notices; shunning it for a few
        seconds spares each request a failed connect. If every pod is shunned, try them anyway.
        """
        now = time.monotonic()
        healthy = [p for p in pods if self._unreachable.get((p.namespace, p.name), 0.0) <= now]
        turns = self._turns.setdefault(model, itertools.count())
        return pick(healthy or pods, self.in_flight, next(turns))

    def forget(self, model: Hashable) -> None:
        """A deleted model's turns."""
        self._turns.pop(model, None)

    def unreachable(self, pod: PodInfo) -> None:
        self._unreachable[(pod.namespace, pod.name)] = time.monotonic() + self.shun_seconds

    @contextmanager
    def track(self, pod: PodInfo) -> Iterator[None]:
        key = (pod.namespace, pod.name)
        self.in_flight[key] = self.in_flight.get(key, 0) + 1
        try:
            yield
        finally:
            left = self.in_flight[key] - 1
            if left:
                self.in_flight[key] = left
            else:
                del self.in_flight[key]
