"""The GPUPool resource as pydantic models: one shared GPU's memory, and how room is made on it."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import Field, ValidationError

from snooze.api.durations import parse_duration
from snooze.api.models import (
    Duration,
    Quantity,
    SpecError,
    Wire,
    describe_validation_error,
)
from snooze.api.modelstatus import Condition, Status, parse_leniently
from snooze.api.quantities import parse_quantity

KIND = "GPUPool"
PLURAL = "gpupools"
SINGULAR = "gpupool"
SHORT_NAMES = ["gpool"]


class Eviction(StrEnum):
    LEAST_RECENTLY_USED = "LeastRecentlyUsed"
    CHEAPEST = "Cheapest"


class HeadroomSpec(Wire):
    """Room the pool keeps free ahead of wakes, by putting idle members to sleep early."""

    wakes: int = Field(default=1, ge=1, le=16)
    """Keep room for this many wakes of the largest sleeping members (1: the next wake of any
    sleeping member finds room at once)."""
    idle_after: Duration = "30s"
    """Only a member that has served nothing for this long sleeps for headroom."""

    @property
    def idle_after_seconds(self) -> float:
        return parse_duration(self.idle_after)


class PrimeSpec(Wire):
    """Each member's first level-1 sleep done ahead of need: it pins host RAM for the copy of
    the weights, which makes it several times slower than the member's later ones (PyTorch
    keeps the pinned blocks for the life of the process)."""

    idle_after: Duration = "10s"
    """Only a member that has served nothing for this long is primed."""

    @property
    def idle_after_seconds(self) -> float:
        return parse_duration(self.idle_after)


class GPUPoolSpec(Wire):
    """One device (a GPU shared through a DRA ResourceClaim, or time-slicing) and its members."""

    memory: Quantity
    """The device memory the members share, such as 80Gi: the awake footprints of awake, waking
    and starting members plus what sleeping members still hold never exceed it."""
    host_memory: Quantity | None = None
    """Optional: host RAM for the members' pinned copies of their weights; a member whose
    level-1 sleep would exceed it sleeps at level 2 instead (nothing kept in host RAM). A copy
    outlives the wake: once an engine has slept at level 1 its process keeps that RAM, awake
    or asleep, until it restarts, and its later level-1 sleeps take no more."""
    eviction: Eviction = Eviction.LEAST_RECENTLY_USED
    """Which awake member sleeps to make room: LeastRecentlyUsed, or Cheapest (the one whose
    wake costs least and whose next request is least likely soon, by its requests of the last
    ten minutes and the time since its last). Lower priorities first."""
    min_residency: Duration = "30s"
    """A woken member is not put to sleep for another one sooner than this (no thrashing)."""
    headroom: HeadroomSpec | None = None
    """Optional: once no wake waits and the next wake would not fit, idle members sleep ahead
    of need (never a busy one, never inside minResidency or below minAwake), so that a request
    for a sleeping member waits for its wake only, not for another member's sleep first.
    Without it, room is made only when a wake asks for it (lazy)."""
    prime: PrimeSpec | None = None
    """Optional: a member whose model sleeps at level 1 and whose engine never did is put to
    sleep once while the pool is quiet and it is idle (one member at a time, never a busy one,
    never inside minResidency or below minAwake, within hostMemory), then woken back at once
    into its own room if no wake took it meanwhile. Its later sleeps, when room is needed on a
    request's path, reuse the pinned RAM. Only in pools whose members do not all fit awake."""
    resource_claim_name: str | None = Field(
        default=None, min_length=1, max_length=253, pattern=r"^[a-z0-9]([-.a-z0-9]*[a-z0-9])?$"
    )
    """Optional: pods that reference this ResourceClaim are members, as are pods labelled
    snooze.dev/pool with the pool's name."""

    @property
    def memory_bytes(self) -> int:
        return parse_quantity(self.memory)

    @property
    def host_memory_bytes(self) -> int | None:
        return None if self.host_memory is None else parse_quantity(self.host_memory)

    @property
    def min_residency_seconds(self) -> float:
        return parse_duration(self.min_residency)


def parse_pool_spec(raw: dict[str, Any]) -> GPUPoolSpec:
    """Validate a GPUPool spec from the API; raise SpecError naming each bad field."""
    try:
        return GPUPoolSpec.model_validate(raw)
    except ValidationError as exc:
        raise SpecError(describe_validation_error(exc, prefix="spec")) from None


class PoolMemberState(StrEnum):
    """The values of a GPUPool member's `state`: where its engine is, as the pool sees it."""

    AWAKE = "awake"
    WAKING = "waking"
    DRAINING = "draining"
    EVICTING = "evicting"
    """Chosen to make room: put to sleep now."""
    ASLEEP = "asleep"
    STARTING = "starting"
    """Its pod is up, its engine loading."""
    WAITING_FOR_ROOM = "waitingForRoom"
    """Starting, and the device has no room for it yet (vLLM would refuse to load)."""
    UNKNOWN = "unknown"
    """Not probed yet, or its last wake ran out of memory: counted at its footprint."""


class PoolMember(Status):
    """One member engine, as the pool last saw it."""

    pod: str
    """The pod's name."""
    model: str
    """The InferenceModel it serves."""
    state: str
    """awake, waking, draining, evicting (chosen to make room), asleep, starting (its engine
    loading), waitingForRoom (starting, and the device has no room for it yet) or unknown (not
    probed yet, or its last wake ran out of memory)."""
    footprint_bytes: int = 0
    """Device memory it takes awake."""
    holds_bytes: int = 0
    """Device memory it holds now (its footprint, or its asleep residue)."""
    host_bytes: int = 0
    """Host RAM it holds now: the pinned copy of its weights, while asleep at level 1 and, once
    made, after its wake too (PyTorch keeps the pinned blocks until the engine exits)."""
    host_copy: bool = False
    """Its engine process keeps such a copy from an earlier level-1 sleep."""
    pod_uid: str = ""
    """The pod's uid: with restarts, the engine process that hostCopy speaks of (a recreated
    pod holds no copy)."""
    restarts: int | None = None
    """Its engine container's restartCount (a restarted container holds no copy)."""
    priority: int = 0
    """Its model's spec.pool.priority."""
    primed: bool = False
    """It sleeps, or is going to sleep, only to pin its host copy ahead of need (the pool's
    prime): it is woken back into its own room unless a wake takes that room first."""
    untrusted: bool = False
    """The pool does not trust its sleep to give the device its memory back: a wake that
    counted on that memory ran out of memory, or it says it sleeps though Snooze never put it
    to sleep. It counts at its whole footprint, asleep too, until its engine restarts (or, for
    the latter, until it is seen awake)."""


class GPUPoolStatus(Status):
    """What the pool's coordinator last saw and decided."""

    memory_bytes: int = 0
    """The pool's device memory."""
    used_bytes: int = 0
    """Held by members now: awake, waking and starting footprints plus asleep residues."""
    awake_bytes: int = 0
    """Held by awake, waking, draining and starting members."""
    asleep_bytes: int = 0
    """Held by sleeping members (what their sleep could not free)."""
    free_bytes: int = 0
    """Not held by any member."""
    host_memory_bytes: int | None = None
    """spec.hostMemory, if set."""
    host_used_bytes: int = 0
    """Host RAM the members hold: their pinned copies of weights (see PoolMember.hostBytes)."""
    used: str = ""
    """used_bytes for people (`60GiB/70GiB`)."""
    awake: int = 0
    """Members awake."""
    members: list[PoolMember] = Field(default_factory=list)
    """Each member engine."""
    waiting: int = 0
    """Wakes and starting members waiting for room."""
    waiting_models: list[str] = Field(default_factory=list)
    """The models whose wakes or starting members wait, starting members first."""
    evictions: int = 0
    """Members put to sleep to make room, since the pool was created (kept across restarts of
    the operator)."""
    conditions: list[Condition] = Field(default_factory=list)
    """Overcommitted (the declared footprints cannot be met even with all but one member
    asleep), ClaimConflict (another pool names the same ResourceClaim), MemoryNotFreed (members
    the pool no longer trusts to free their memory asleep) and SpecValid."""
    observed_generation: int | None = None
    """The metadata.generation the operator last acted on."""


def parse_pool_status(raw: object) -> GPUPoolStatus:
    """A GPUPool's status as the API holds it: the one way the operator reads it (leniently,
    as modelstatus.parse_leniently says)."""
    return parse_leniently(GPUPoolStatus, raw)


__all__ = [
    "KIND",
    "PLURAL",
    "SHORT_NAMES",
    "SINGULAR",
    "Eviction",
    "GPUPoolSpec",
    "GPUPoolStatus",
    "HeadroomSpec",
    "PoolMember",
    "PrimeSpec",
    "parse_pool_spec",
    "parse_pool_status",
]
