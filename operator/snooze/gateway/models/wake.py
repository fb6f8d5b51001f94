"""Asking the operator for a wake: one annotation per wake, one writer per model.

Every request held for a model waits on the same wake request. When none stands, the first
of them starts a writer (read the model afresh, annotate it); the others await that same
writer and share its outcome, so that fifty requests cost one write, and an API that fails
costs one bounded attempt (`--wake-request-timeout`) whose failure all fifty get at once.
After a failure, requests are answered 503 for FAILURE_MEMORY_SECONDS without asking again.
What the API said goes to the log; clients get a message with no API paths or addresses.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from snooze.api.agreed import WAKE_REQUESTED_ANNOTATION
from snooze.api.times import format_time
from snooze.gateway.metrics import GatewayMetrics
from snooze.gateway.models.model import Key, Model
from snooze.gateway.models.registry import Registry
from snooze.kube.api import KubeApi, models_ref
from snooze.policy.wakes import wake_pending

log = logging.getLogger(__name__)

FAILURE_MEMORY_SECONDS = 2.0
"""How long a failed wake request is answered from memory (the Retry-After it gives)."""
REASK_SECONDS = 1.0
"""The least time between two wake requests of this replica for one model, whatever the
pods' sleep times say (a clock ahead of the gateway's must not make it ask in a loop)."""


class WakeRequestFailed(Exception):
    """The wake request could not be written; the message is fit for clients."""

    def __init__(self, message: str, *, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class WakeRequests:
    """The wake requests of this gateway replica, per model."""

    def __init__(
        self,
        *,
        api: KubeApi,
        registry: Registry,
        metrics: GatewayMetrics,
        bound: float,
        recent: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.api = api
        self.registry = registry
        self.metrics = metrics
        self.bound = bound
        self.recent = recent
        self.clock = clock
        self.written = 0
        """Annotations written by this replica (for tests and logs)."""
        self._asked: dict[Key, float] = {}
        self._writers: dict[Key, asyncio.Task[float | None]] = {}
        self._failed: dict[Key, tuple[float, WakeRequestFailed]] = {}

    def standing(self, model: Model) -> float | None:
        """When the wake request that a request for `model` waits on was made, if one stands."""
        requested = max(
            (t for t in (model.wake_requested_at, self._asked.get(model.key)) if t),
            default=None,
        )
        if model.spec is None or requested is None:
            return None
        sleeps = [p.sleep_started for p in self.registry.pods_of(model) if p.sleep_started]
        if model.scaled_to_zero_at is not None:
            sleeps.append(model.scaled_to_zero_at)
        pending = wake_pending(
            requested_at=requested,
            slept_at=max(sleeps, default=None),
            now=self.clock(),
            wake_timeout=model.hold_seconds(),
            recent=self.recent,
        )
        return requested if pending else None

    def due(self, model: Model) -> float | None:
        """None while a wake request stands for `model`; else the seconds until this replica
        may ask again (0: now)."""
        if self.standing(model) is not None:
            return None
        last = self._asked.get(model.key)
        return 0.0 if last is None else max(0.0, last + REASK_SECONDS - self.clock())

    async def ensure(self, model: Model) -> float | None:
        """Make sure a wake request stands for `model`; when it was made (None: no wake is
        needed). Raises WakeRequestFailed, the same for every request that waited on it."""
        current = self.registry.get(model.key) or model
        if current.spec is None or self.registry.awake_pods(current):
            return None
        standing = self.standing(current)
        if standing is not None:
            return standing
        last = self._asked.get(model.key)
        if last is not None and self.clock() - last < REASK_SECONDS:
            return last  # asked a moment ago: `due` says when to ask again
        failed = self._failed.get(model.key)
        if failed is not None and time.monotonic() < failed[0]:
            raise failed[1]
        writer = self._writers.get(model.key)
        if writer is None:
            writer = asyncio.create_task(self._write(current), name=f"wake-{model.key}")
            self._writers[model.key] = writer
            writer.add_done_callback(lambda task: self._done(model.key, task))
        # Shielded: a client that leaves does not cancel the write the others wait on.
        return await asyncio.shield(writer)

    def _done(self, key: Key, task: asyncio.Task[float | None]) -> None:
        self._writers.pop(key, None)
        if not task.cancelled():
            task.exception()  # retrieved: waiters may all have left

    async def _write(self, model: Model) -> float | None:
        try:
            async with asyncio.timeout(self.bound):
                return await self._annotate(model)
        except Exception as exc:  # the API refused, failed, could not be reached, or was slow
            log.warning(
                "could not write a wake request for %s/%s: %s",
                model.namespace,
                model.name,
                f"no answer within {self.bound:g}s" if isinstance(exc, TimeoutError) else exc,
            )
            failure = WakeRequestFailed(
                f"could not ask the operator to wake model {model.model_name!r}: the "
                "Kubernetes API did not take the wake request (the gateway's log says why); "
                f"retry in {FAILURE_MEMORY_SECONDS:g}s",
                retry_after=FAILURE_MEMORY_SECONDS,
            )
            self._failed[model.key] = (time.monotonic() + FAILURE_MEMORY_SECONDS, failure)
            raise failure from None

    async def _annotate(self, model: Model) -> float | None:
        # Another replica may have asked since our watch last spoke: read the model afresh,
        # which narrows the window in which two replicas both annotate to one round trip.
        # A list by name, not a get: the gateway's RBAC grants list, watch and patch only.
        listing = await self.api.request(
            "GET",
            models_ref(model.namespace).path,
            params={"fieldSelector": f"metadata.name={model.name}"},
        )
        for fresh in listing.get("items") or []:
            self.registry.note_model(fresh)
        current = self.registry.get(model.key) or model
        if current.spec is None or self.registry.awake_pods(current):
            return None
        standing = self.standing(current)
        if standing is not None:
            return standing
        now = self.clock()
        stamp = format_time(now)
        patch = {"metadata": {"annotations": {WAKE_REQUESTED_ANNOTATION: stamp}}}
        body = await self.api.patch(models_ref(model.namespace), model.name, patch)
        self._asked[model.key] = now
        self._failed.pop(model.key, None)
        self.written += 1
        self.metrics.wake_requested(model.namespace, model.name)
        self.registry.note_model(body)
        log.info("asked for a wake of %s/%s", model.namespace, model.name)
        return now
