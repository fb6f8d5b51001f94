"""What a model's loop asks of its GPU pools at each cycle: room for the members that wake
(withdrawn for the rest), a look again when what the pools read of its members changed, and
why a wake (or a start) waits; a member whose pool is not the one its spec names is told once."""

from __future__ import annotations

from typing import Any

from snooze.api.eventreasons import EventReason
from snooze.api.models import InferenceModelSpec
from snooze.api.quantities import format_gib
from snooze.kube.pods import PodInfo
from snooze.operator.events.emit import Emit
from snooze.operator.pool.loop import PoolHub
from snooze.policy import sleep as sleep_policy


class PoolAsks:
    """One model's asks of the GPU pools its members are in, cycle after cycle."""

    def __init__(self, *, namespace: str, name: str, pools: PoolHub, emit: Emit) -> None:
        self.namespace = namespace
        self.name = name
        self.pools = pools
        self.emit = emit
        self._asked: set[str] = set()
        """The pools this model asked room of at its last cycle."""
        self._mismatched: set[str] = set()
        """Pods told (once) to be in another pool than spec.pool.name says."""
        self._seen: tuple[Any, ...] = ()
        """What the pools read of its members at the last cycle."""

    def ask(
        self,
        spec: InferenceModelSpec,
        pods: list[PodInfo],
        actions: list[sleep_policy.Action],
        views: list[sleep_policy.EngineView],
        now: float,
    ) -> str | None:
        """Tell each GPU pool which of this model's members ask for room (withdrawing the
        rest), poke it when its members changed, and say why a wake (or a start) waits, if
        one does."""
        asking = {a.pod for a in actions if a.kind is sleep_policy.ActionKind.ASK_ROOM}
        by_pool: dict[str, set[str]] = {}
        members: dict[str, set[str]] = {}  # a member that starts waits for room too
        missing: set[str] = set()
        for pod in pods:
            name, loop = self.pools.pool_of(self.namespace, pod, spec)
            if name is None:
                continue
            declared = spec.pool.name if spec.pool else None
            if declared is not None and name != declared and pod.name not in self._mismatched:
                self._mismatched.add(pod.name)
                self.emit(
                    "Warning",
                    EventReason.POOL_MISMATCH,
                    f"{pod.name} is a member of GPUPool {name} (its snooze.dev/pool label or "
                    f"ResourceClaim says so), not of {declared} as spec.pool.name says: "
                    "make them agree",
                )
            if loop is None:
                if pod.name in asking:
                    missing.add(name)
                continue
            by_pool.setdefault(name, set())
            members.setdefault(name, set()).add(pod.name)
            if pod.name in asking:
                by_pool[name].add(pod.name)
        for name in self._asked - set(by_pool):
            gone = self.pools.loops.get((self.namespace, name))
            if gone is not None:
                gone.ask(self.name, (), now)
        self._asked = set(by_pool)
        # What the pools read of these members: a change must poke them, which otherwise look
        # again only once per interval. A pod scheduled onto its node is one: Pending, it
        # holds nothing on the device and the pool leaves it out; once there, it starts.
        scheduled = {p.name: p.scheduled for p in pods}
        seen = tuple(
            (v.pod, scheduled.get(v.pod), v.ready, v.label, v.sleeping, v.busy, v.action_running)
            for v in views
            if v.pooled
        )
        for name, asks in by_pool.items():
            loop = self.pools.loops[(self.namespace, name)]
            loop.ask(self.name, asks, now)
            if seen != self._seen:
                loop.poke()
        self._seen = seen
        if missing:
            return (
                f"GPUPool {', '.join(sorted(missing))} not found in namespace "
                f"{self.namespace}: its members wake only once it exists"
            )
        for name, pods_in_pool in members.items():
            wait = self.pools.loops[(self.namespace, name)].waiting_for(pods_in_pool)
            if wait is not None:
                return f"waiting for {format_gib(wait.need)} on GPUPool {name}: {wait.reason}"
        return None
