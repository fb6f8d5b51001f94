"""What happened over time: samples of every pod's state and GPU memory, of every GPU pool's
memory, and the failures and swaps seen; picture.py draws them."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from snooze.api.models import EngineState

GIB = 1024**3


class Shown(StrEnum):
    """The two states of a pod the demo draws beside its published one (EngineState)."""

    LOADING = "loading"
    """Not Ready yet: its engine loads."""
    ABSENT = "absent"
    """It did not exist then."""


COLOURS: dict[str, str] = {
    EngineState.AWAKE: "#2e7d32",
    EngineState.DRAINING: "#f9a825",
    EngineState.ASLEEP: "#1565c0",
    EngineState.WAKING: "#8e24aa",
    EngineState.FAILED: "#c62828",
    Shown.LOADING: "#90a4ae",
    Shown.ABSENT: "#eeeeee",
}
OUTCOMES = {"ok": "#2e7d32", "held": "#ef6c00", "error": "#c62828"}
# One colour per member of a GPU pool, apart from the states' colours: its memory in the
# pool's row and its name in its own row.
MEMBERS = ["#3949ab", "#00897b", "#d81b60", "#6d4c41", "#7cb342", "#5e35b1"]
FREE = "#e0e0e0"


@dataclass(frozen=True, kw_only=True)
class PodSample:
    model: str
    state: str
    gpu_bytes: int


@dataclass(frozen=True, kw_only=True)
class ModelSample:
    phase: str
    awake: int
    asleep: int
    held: int
    last_wake_time: datetime | None
    last_wake_seconds: float | None
    waiting_for_room: str | None = None
    """The message of its WaitingForRoom condition while True: its wake waits for its pool."""


@dataclass(frozen=True, kw_only=True)
class PoolSample:
    """One GPU pool at one instant: the device's own count and the pool's."""

    memory_bytes: int
    """The device's memory."""
    held: Mapping[str, int]
    """Per member model, what its engines hold on the device (the simulated GPU's count)."""
    counted_bytes: int
    """What the pool's coordinator counts as used (its status): never below the device's."""
    waiting: tuple[str, ...] = ()
    """The models whose wakes wait for room, first come first served."""

    @property
    def free_bytes(self) -> int:
        return self.memory_bytes - sum(self.held.values())


@dataclass(frozen=True, kw_only=True)
class Swap:
    """A pool member put to sleep to make room, `t` seconds in (the MakingRoom Event)."""

    t: float
    pool: str
    pod: str
    model: str
    """The member put to sleep."""
    making_room_for: str
    """The model whose wake needs the room, or `starting POD` for members that start."""

    @property
    def for_start(self) -> bool:
        return self.making_room_for.startswith("starting ")

    def describe(self) -> str:
        return f"{self.pool}: {self.pod} ({self.model}) sleeps to make room for " + (
            self.making_room_for
        )


@dataclass(frozen=True, kw_only=True)
class Incident:
    """Something that went wrong, or the operator's remedy for it, `t` seconds in."""

    t: float
    model: str
    what: str
    """`wake failed`, `sleep failed` or `pod restarted`."""
    reason: str
    """The operator's reason: HybridKVCacheReinit, Timeout, Unreachable..."""

    def describe(self) -> str:
        return f"{self.what} ({self.reason})" if self.reason else self.what


@dataclass(frozen=True, kw_only=True)
class Sample:
    """The cluster at one instant, `t` seconds after the scenario started."""

    t: float
    pods: Mapping[str, PodSample]
    models: Mapping[str, ModelSample]
    incidents: tuple[Incident, ...] = ()
    """Those first seen at this sample."""
    pools: Mapping[str, PoolSample] = field(default_factory=dict)
    swaps: tuple[Swap, ...] = ()
    """Those first seen at this sample."""


def failed(pod: PodSample) -> PodSample:
    return PodSample(model=pod.model, state="failed", gpu_bytes=pod.gpu_bytes)


def with_failed(sample: Sample, pods: set[str]) -> Sample:
    """The sample with these pods drawn as failed (pure)."""
    if not pods:
        return sample
    redrawn = {n: failed(p) if n in pods else p for n, p in sample.pods.items()}
    return dataclasses.replace(sample, pods=redrawn)


@dataclass
class Timeline:
    """Samples in time order, and the wake durations seen in the operator's metric."""

    samples: list[Sample] = field(default_factory=list)
    wakes: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    """Per model, (time, seconds) of each wake the operator measured."""
    incidents: list[Incident] = field(default_factory=list)
    """Failures and restarts, in time order."""
    swaps: list[Swap] = field(default_factory=list)
    """Pool members put to sleep to make room, in time order."""

    def add(self, sample: Sample) -> None:
        self.samples.append(sample)

    def lanes(self, model: str) -> list[str]:
        """The model's pods in order of first appearance: one lane each in the picture."""
        seen: dict[str, None] = {}
        for sample in self.samples:
            for pod, info in sample.pods.items():
                if info.model == model:
                    seen.setdefault(pod, None)
        return list(seen)

    def spans(self, model: str, pod: str) -> list[tuple[float, float, str]]:
        """(start, end, state) runs of one pod; `absent` where it did not exist (pure)."""
        runs: list[tuple[float, float, str]] = []
        for here, after in zip(self.samples, self.samples[1:], strict=False):
            info = here.pods.get(pod)
            state = info.state if info is not None and info.model == model else Shown.ABSENT
            if runs and runs[-1][2] == state and runs[-1][1] == here.t:
                runs[-1] = (runs[-1][0], after.t, state)
            else:
                runs.append((here.t, after.t, state))
        return runs

    def states_seen(self, model: str) -> set[str]:
        """Every state any of the model's pods was drawn in."""
        return {p.state for s in self.samples for p in s.pods.values() if p.model == model}

    def incidents_of(self, model: str) -> list[Incident]:
        return [i for i in self.incidents if i.model == model]

    def serving_again(self, model: str, after: float) -> float | None:
        """When the model next had an awake pod after `after`, if it did."""
        for sample in self.samples:
            if sample.t > after and any(
                p.model == model and p.state == "awake" for p in sample.pods.values()
            ):
                return sample.t
        return None

    def gpu_gib(self, model: str) -> tuple[list[float], list[float]]:
        times = [s.t for s in self.samples]
        values = [
            sum(p.gpu_bytes for p in s.pods.values() if p.model == model) / GIB
            for s in self.samples
        ]
        return times, values

    def pool_gib(
        self, pool: str, members: Sequence[str]
    ) -> tuple[list[float], dict[str, list[float]], list[float], list[float]]:
        """Over the samples that saw the pool: times, GiB held per member, GiB free (the
        device's count) and GiB used as the pool's coordinator counts it."""
        seen = [(s.t, s.pools[pool]) for s in self.samples if pool in s.pools]
        times = [t for t, _ in seen]
        held = {m: [p.held.get(m, 0) / GIB for _, p in seen] for m in members}
        free = [p.free_bytes / GIB for _, p in seen]
        counted = [p.counted_bytes / GIB for _, p in seen]
        return times, held, free, counted

    def swaps_of(self, pool: str) -> list[Swap]:
        return [s for s in self.swaps if s.pool == pool]
