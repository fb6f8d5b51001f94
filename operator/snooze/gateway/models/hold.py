"""Per-model queues of held requests: wait until a pod is awake, or until the wait is over."""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from snooze.gateway.models.model import Key, Model, WakeFailure
from snooze.gateway.models.registry import Registry
from snooze.gateway.models.wake import WakeRequestFailed, WakeRequests
from snooze.kube.pods import PodInfo
from snooze.policy.sleep import NOT_RETRIED


def known_failure(
    model: Model, pods: Sequence[PodInfo], *, asked_at: float | None
) -> WakeFailure | None:
    """Pure: the wake failure that answers a held request now, or None to keep holding.

    Known when the model's `WakeFailed` condition is True, every ready pod of the model has
    failed (its label, or its entry on the status, says `failed`), and either the condition
    was set no earlier than the wake request the request waits on (`asked_at`), or every
    pod failed in a way the operator never retries (the hybrid KV-cache crash, a wake that
    answered differently). Never under `wake.onFailure: Restart`: the restarted pod may yet
    serve.
    """
    failure = model.wake_failure
    if model.spec is None or model.spec.wake.on_failure == "Restart" or failure is None:
        return None
    ready = [p for p in pods if p.ready]
    entries = [model.failed_pod(p) for p in ready]
    if not entries or any(entry is None for entry in entries):
        return None
    # The annotation has millisecond precision; the condition's time too.
    if (
        asked_at is not None
        and failure.since is not None
        and failure.since >= math.floor(asked_at * 1000) / 1000
    ):
        return failure
    if all(entry and entry.failure_reason in NOT_RETRIED for entry in entries):
        return failure
    return None


def nothing_to_wake(model: Model, pods: Sequence[PodInfo], *, coming_back: float) -> bool:
    """Pure: whether nothing will serve a request for `model`, so that it is answered now
    rather than held until its wake timeout: the operator says its selector matches no pod,
    it has no workload that a wake scales up (a scaleTargetRef at zero replicas is woken by
    scaling it up), and the gateway sees no pod of it either (one that is starting, or that
    came after the operator wrote its status, is waited for), nor one that went so lately
    that its controller may be recreating it (`coming_back`: seconds it still counts)."""
    return (
        model.no_pods
        and model.spec is not None
        and model.spec.scale_target_ref is None
        and not pods
        and coming_back <= 0
    )


class Outcome(enum.Enum):
    AWAKE = "awake"
    TIMEOUT = "timeout"
    GONE = "gone"
    REFUSED = "refused"
    FAILED = "failed"
    """The wake failed, and the operator will not try again for this request."""
    SHUTDOWN = "shutdown"
    """The gateway is shutting down and its grace period is over."""
    NOT_ASKED = "not_asked"
    """A wake had to be asked for again, and the API did not take the request."""
    NO_ENGINES = "no_engines"
    """The model's last pod went (see nothing_to_wake)."""
    UNCLAIMED = "unclaimed"
    """The model no longer holds the name the request asked for (the operator settled a
    clash, or its spec changed)."""


@dataclass(frozen=True, kw_only=True)
class Waited:
    outcome: Outcome
    failure: WakeFailure | None = None
    asked_at: float | None = None
    """The wake request a FAILED wait waited on."""
    not_asked: WakeRequestFailed | None = None


class Holds:
    """Held requests per model."""

    def __init__(self, *, registry: Registry, wakes: WakeRequests, max_held: int) -> None:
        self.registry = registry
        self.wakes = wakes
        self.max_held = max_held
        self.held: dict[Key, int] = {}
        self.closing = False

    def close(self) -> None:
        """Release every held request (Outcome.SHUTDOWN): the gateway is going away."""
        self.closing = True
        self.registry.poke()

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

    async def wait_awake(
        self,
        model: Model,
        *,
        name: str,
        asked_at: float | None,
        deadline: float,
        tick: float,
        on_tick: Callable[[], Awaitable[None]] | None = None,
    ) -> Waited:
        """Wait (monotonic `deadline`) for an awake pod; `on_tick` runs every `tick` seconds.

        While it waits, a wake request stands for it: when the one it waited on is over
        without an awake pod (the pods slept after it, say a drain that raced the wake, or a
        freshly started pod judged idle), it asks again (`asked_at` is the request's time).
        """
        next_tick = time.monotonic() + tick
        while True:
            if self.closing:
                return Waited(outcome=Outcome.SHUTDOWN)
            current = self.registry.get(model.key)
            if current is None:
                return Waited(outcome=Outcome.GONE)
            if not current.holds(name):
                return Waited(outcome=Outcome.UNCLAIMED)
            if self.registry.awake_pods(current):
                return Waited(outcome=Outcome.AWAKE)
            if current.refusal() is not None:
                return Waited(outcome=Outcome.REFUSED)
            coming_back = self.registry.coming_back(current)
            if nothing_to_wake(current, self.registry.pods_of(current), coming_back=coming_back):
                return Waited(outcome=Outcome.NO_ENGINES)
            due = self.wakes.due(current)
            if due == 0.0:
                try:
                    asked_at = await self.wakes.ensure(current) or asked_at
                except WakeRequestFailed as exc:
                    return Waited(outcome=Outcome.NOT_ASKED, not_asked=exc)
                continue
            failure = known_failure(current, self.registry.pods_of(current), asked_at=asked_at)
            if failure is not None:
                return Waited(outcome=Outcome.FAILED, failure=failure, asked_at=asked_at)
            now = time.monotonic()
            if now >= deadline:
                return Waited(outcome=Outcome.TIMEOUT)
            if on_tick is not None and now >= next_tick:
                await on_tick()
                next_tick = now + tick
            until = min(deadline, next_tick) if on_tick is not None else deadline
            if due is not None:
                until = min(until, now + due)
            if current.no_pods and coming_back > 0:
                until = min(until, now + coming_back)  # then judged without that pod
            await self.registry.wait_change(max(0.0, until - now))
