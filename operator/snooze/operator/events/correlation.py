"""Repeated Events told as Kubernetes' own recorder tells them: pure, the clock an argument.

client-go's EventCorrelator (tools/record/events_cache.go, v0.34) is the model, with its
defaults: an Event said again with the same message is a patch of the one written before
(its count and lastTimestamp move), not a new object; once ten Events of one object, type
and reason but different messages come within ten minutes, the next ones are one Event,
"(combined from similar events): " and the latest message, counted; and each object gets a
burst of 25 writes of a type, then one every five minutes, so that a model that flaps costs
the API a bounded number of writes however often it flaps. An occurrence that the budget
holds back is still counted, in the count of the next write of its Event.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Generic, TypeVar

AGGREGATE_AFTER = 10
"""Similar Events (other messages) within AGGREGATE_SECONDS before they are combined."""
AGGREGATE_SECONDS = 600.0
BURST = 25
"""Writes of one type an object gets at once..."""
REFILL_SECONDS = 300.0
"""...and then one more each this often."""
CACHE_ENTRIES = 4096
"""Objects, Events and groups remembered (the least recently told are forgotten first)."""
COMBINED = "(combined from similar events): "

K = TypeVar("K")
V = TypeVar("V")


class _Recent(Generic[K, V]):
    """A dict that forgets its least recently used entries beyond CACHE_ENTRIES."""

    def __init__(self) -> None:
        self._items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > CACHE_ENTRIES:
            self._items.popitem(last=False)


@dataclass(frozen=True, kw_only=True)
class Regarding:
    """The object an Event is about."""

    namespace: str
    kind: str
    name: str
    uid: str = ""
    api_version: str = ""


@dataclass(frozen=True, kw_only=True)
class Told:
    """One thing the operator says of an object."""

    regarding: Regarding
    type: str
    reason: str
    message: str


@dataclass(frozen=True, kw_only=True)
class Write:
    """What to write for an occurrence: a new Event (`patch` False), or a patch of the one
    written before under the same `name`."""

    told: Told
    """What it says (its message combined, once similar ones are)."""
    name: str
    count: int
    first: float
    last: float
    patch: bool


@dataclass(frozen=True)
class _Logged:
    name: str
    count: int
    first: float


@dataclass(frozen=True)
class _Similar:
    messages: frozenset[str]
    last: float


@dataclass(frozen=True)
class _Bucket:
    tokens: float
    at: float


def event_name(regarding: Regarding, now: float) -> str:
    """client-go's name for a new Event: the object's name and the time in hexadecimal
    nanoseconds (no longer than a name may be)."""
    suffix = f".{int(now * 1e9):x}"
    return regarding.name[: 253 - len(suffix)] + suffix


class Correlator:
    """What to write for each Event told, remembering the Events written (see the module)."""

    def __init__(self) -> None:
        self._similar: _Recent[tuple[object, ...], _Similar] = _Recent()
        self._logged: _Recent[tuple[object, ...], _Logged] = _Recent()
        self._buckets: _Recent[tuple[object, ...], _Bucket] = _Recent()

    def correlate(self, told: Told, now: float) -> Write | None:
        """The write for `told` at `now`, or None when its object's budget holds it back."""
        told, key = self._aggregate(told, now)
        logged = self._logged.get(key)
        if logged is None:
            logged = _Logged(name=event_name(told.regarding, now), count=1, first=now)
            patch = False
        else:
            logged = _Logged(name=logged.name, count=logged.count + 1, first=logged.first)
            patch = True
        self._logged.put(key, logged)
        if not self._spend(told, now):
            return None
        return Write(
            told=told, name=logged.name, count=logged.count, first=logged.first, last=now,
            patch=patch,
        )  # fmt: skip

    def _aggregate(self, told: Told, now: float) -> tuple[Told, tuple[object, ...]]:
        group = self._group(told)
        similar = self._similar.get(group)
        if similar is None or now - similar.last > AGGREGATE_SECONDS:
            similar = _Similar(messages=frozenset(), last=now)
        messages = similar.messages | {told.message}
        if len(messages) < AGGREGATE_AFTER:
            self._similar.put(group, _Similar(messages=messages, last=now))
            return told, self._key(told)
        # Over the threshold: one Event for the group from now on (the set stays bounded).
        kept = frozenset(sorted(messages)[: AGGREGATE_AFTER - 1])
        self._similar.put(group, _Similar(messages=kept, last=now))
        combined = Told(
            regarding=told.regarding,
            type=told.type,
            reason=told.reason,
            message=COMBINED + told.message,
        )
        return combined, group

    def _spend(self, told: Told, now: float) -> bool:
        key = (told.regarding, told.type)
        bucket = self._buckets.get(key) or _Bucket(tokens=float(BURST), at=now)
        tokens = min(float(BURST), bucket.tokens + (now - bucket.at) / REFILL_SECONDS)
        allowed = tokens >= 1.0
        self._buckets.put(key, _Bucket(tokens=tokens - 1.0 if allowed else tokens, at=now))
        return allowed

    @staticmethod
    def _key(told: Told) -> tuple[object, ...]:
        return (told.regarding, told.type, told.reason, told.message)

    @staticmethod
    def _group(told: Told) -> tuple[object, ...]:
        return (told.regarding, told.type, told.reason)
