"""Per-model wake-and-wait: ask for a wake once, then hold requests until a pod is awake."""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Awaitable, Callable

from snooze.gateway.model import Key, Model
from snooze.gateway.registry import Registry
from snooze.kube.api import KubeApi, models_ref
from snooze.kube.pods import PodInfo, format_time
from snooze.models import WAKE_REQUESTED_ANNOTATION

log = logging.getLogger(__name__)


def wake_pending(
    *,
    requested_at: float | None,
    slept_at: float | None,
    now: float,
    wake_timeout: float,
    recent: float,
) -> bool:
    """Pure: whether a wake request already stands, so that asking again would be noise.

    A request stands while it is newer than the pods' latest sleep (unknown: any) and its
    wake may still be under way: within `wake_timeout`, and never less than `recent`
    seconds, so that replicas asking at once write one annotation between them.
    """
    if requested_at is None:
        return False
    if slept_at is not None and requested_at <= slept_at:
        return False  # the pods slept after it: that wake is over
    return requested_at > now - max(wake_timeout, recent)


class Outcome(enum.Enum):
    AWAKE = "awake"
    TIMEOUT = "timeout"
    GONE = "gone"
    REFUSED = "refused"
    UNCLAIMED = "unclaimed"
    """The model no longer holds the name the request asked for (the operator settled a
    clash, or its spec changed)."""


class Holds:
    """Held requests per model, and the wake requests made for them."""

    def __init__(
        self,
        *,
        api: KubeApi,
        registry: Registry,
        max_held: int,
        recent: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.api = api
        self.registry = registry
        self.max_held = max_held
        self.recent = recent
        self.clock = clock
        self.held: dict[Key, int] = {}
        self.wake_requests = 0
        """Annotations written by this replica (for tests and logs)."""
        self._asked: dict[Key, float] = {}
        self._locks: dict[Key, asyncio.Lock] = {}

    def enter(self, model: Model) -> bool:
        """Take a place in the model's queue; False when it is full."""
        count = self.held.get(model.key, 0)
        if count >= self.max_held:
            return False
        self.held[model.key] = count + 1
        return True

    def leave(self, model: Model) -> None:
        left = self.held.get(model.key, 1) - 1
        if left > 0:
            self.held[model.key] = left
        else:
            self.held.pop(model.key, None)

    async def ensure_wake(self, model: Model) -> None:
        """Annotate the model with a wake request unless one already stands; raises KubeError."""
        lock = self._locks.setdefault(model.key, asyncio.Lock())
        async with lock:  # concurrent first requests: one annotates, the rest see it
            current = self.registry.get(model.key) or model
            if current.spec is None or self.registry.awake_pods(current):
                return
            if self._pending(current):
                return
            # Another replica may have asked since our watch last spoke: read the model afresh,
            # which narrows the window in which two replicas both annotate to one round trip.
            fresh = await self.api.get(models_ref(model.namespace), model.name)
            self.registry.note_model(fresh)
            current = self.registry.get(model.key) or current
            if current.spec is None or self._pending(current):
                return
            now = self.clock()
            patch = {"metadata": {"annotations": {WAKE_REQUESTED_ANNOTATION: format_time(now)}}}
            body = await self.api.patch(models_ref(model.namespace), model.name, patch)
            self._asked[model.key] = now
            self.wake_requests += 1
            self.registry.note_model(body)
            log.info("asked for a wake of %s/%s", model.namespace, model.name)

    def _pending(self, model: Model) -> bool:
        if model.spec is None:
            return True  # an invalid spec: the operator would not act on a request anyway
        requested = max(
            (t for t in (model.wake_requested_at, self._asked.get(model.key)) if t),
            default=None,
        )
        sleeps = [p.sleep_started for p in self.registry.pods_of(model) if p.sleep_started]
        if model.scaled_to_zero_at is not None:
            sleeps.append(model.scaled_to_zero_at)
        return wake_pending(
            requested_at=requested,
            slept_at=max(sleeps, default=None),
            now=self.clock(),
            wake_timeout=model.hold_seconds(),
            recent=self.recent,
        )

    async def wait_awake(
        self,
        model: Model,
        *,
        name: str,
        deadline: float,
        tick: float,
        on_tick: Callable[[], Awaitable[None]] | None = None,
    ) -> tuple[Outcome, list[PodInfo]]:
        """Wait (monotonic `deadline`) for an awake pod; `on_tick` runs every `tick` seconds."""
        next_tick = time.monotonic() + tick
        while True:
            current = self.registry.get(model.key)
            if current is None:
                return Outcome.GONE, []
            if not current.holds(name):
                return Outcome.UNCLAIMED, []
            pods = self.registry.awake_pods(current)
            if pods:
                return Outcome.AWAKE, pods
            if current.refusal() is not None:
                return Outcome.REFUSED, []
            now = time.monotonic()
            if now >= deadline:
                return Outcome.TIMEOUT, []
            if on_tick is not None and now >= next_tick:
                await on_tick()
                next_tick = now + tick
            until = min(deadline, next_tick) if on_tick is not None else deadline
            await self.registry.wait_change(max(0.0, until - now))
