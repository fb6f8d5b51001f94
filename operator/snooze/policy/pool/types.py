"""What the GPU pool decision reads and says: its members, the wakes that ask, the decision."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from snooze.api.gpupool import Eviction


class MemberState(StrEnum):
    AWAKE = "awake"
    WAKING = "waking"
    DRAINING = "draining"
    ASLEEP = "asleep"
    STARTING = "starting"
    """The pod exists but its engine has not loaded: it takes its footprint as soon as it can."""
    UNKNOWN = "unknown"
    """Not observed (probe failed, or not probed yet): counted at its footprint, to be safe."""


RECENT_WINDOW_SECONDS = 600.0
"""How far back the Cheapest order counts a member's requests (ten minutes: several of a
bursty model's bursts, short enough that a model whose traffic stopped soon counts as unwanted)."""

# What a member holds on the device in each state: its footprint, or only its residue.
HOLDS_FOOTPRINT = frozenset(
    {
        MemberState.AWAKE,
        MemberState.WAKING,
        MemberState.DRAINING,
        MemberState.STARTING,
        MemberState.UNKNOWN,
    }
)


@dataclass(frozen=True, kw_only=True)
class Member:
    """One engine on the pool's device, as the pool sees it now."""

    pod: str
    model: str
    state: MemberState
    footprint: int
    """Device memory the engine takes awake, in bytes."""
    residue: int
    """Device memory it still holds asleep."""
    priority: int = 0
    busy: bool = False
    last_used: float = 0.0
    """When it last served a request (or woke)."""
    awake_since: float | None = None
    """When it last became awake: it is not evicted before min_residency has passed."""
    woken_for: float | None = None
    """When the wake that woke it was asked (None: not known, or not woken by a wake of the
    pool's). It passed every wake asked before that one which was waiting then: min_residency
    does not protect it from those (so that no wake starves behind later ones)."""
    level: int = 1
    """The sleep level its model's ask comes to on its engine (1 or 2: a known bug or its
    release can move it); asleep, the level it sleeps at."""
    discards: bool = True
    """It can sleep at level 2. A vLLM release that cannot wake from level 2 sleeps at level 1
    whatever the pool asks: its weights take host RAM all the same."""
    wake_seconds: float = 1.0
    """What a wake of it costs, as last measured (for the Cheapest eviction order)."""
    recent_requests: int = 0
    """Requests it finished in the last RECENT_WINDOW_SECONDS (for the Cheapest order)."""
    weights: int = 0
    """Host RAM its level-1 sleep takes."""
    host_copy: bool = False
    """Its process already holds that host RAM, asleep or awake: an earlier level-1 sleep pinned
    it, and PyTorch's caching host allocator keeps the blocks after the wake frees them, until
    the process ends. Its next level-1 sleep reuses them and takes no more."""

    @property
    def held(self) -> int:
        return self.footprint if self.state in HOLDS_FOOTPRINT else self.residue

    @property
    def frees(self) -> int:
        """What its sleep gives back to the device."""
        return max(self.footprint - self.residue, 0)


@dataclass(frozen=True, kw_only=True)
class ModelNeeds:
    """What a model's own spec says about keeping its members awake."""

    min_awake: int = 0
    keep_awake: bool = False
    """desiredState Awake: none of its members is put to sleep for another model."""


@dataclass(frozen=True, kw_only=True)
class WakeAsk:
    """A member its model loop wants awake."""

    pod: str
    asked_at: float
    """When it first asked (or when its clients came back); the queue's order."""
    lazy: bool = False
    """Woken back after a priming sleep: granted only into room that is free after every other
    ask, never by evicting anyone; it never waits (not granted, it sleeps on). The headroom
    then keeps its room by its own rule (members idle for its idle_after)."""
    abandoned: bool = False
    """The requests that asked for it are all gone (the gateway holds none for its model any
    more): it keeps no place in the queue, and wakes only into room that is free after every
    other wake, putting nobody to sleep."""


@dataclass(frozen=True, kw_only=True)
class Headroom:
    """Room kept free ahead of wakes: for the next `wakes` wakes of the largest sleepers."""

    wakes: int = 1
    idle_after: float = 30.0
    """Only a member that has served nothing for this long sleeps for headroom."""


@dataclass(frozen=True, kw_only=True)
class Prime:
    """Members whose model sleeps at level 1 and whose process holds no pinned copy yet sleep
    once ahead of need, one at a time, while the pool is quiet, and are woken back at once."""

    idle_after: float = 10.0
    """Only a member that has served nothing for this long is primed."""


@dataclass(frozen=True, kw_only=True)
class PoolView:
    memory: int
    host_memory: int | None
    eviction: Eviction
    min_residency: float
    members: Sequence[Member]
    asks: Sequence[WakeAsk]
    models: Mapping[str, ModelNeeds] = field(default_factory=dict)
    now: float = 0.0
    headroom: Headroom | None = None
    prime: Prime | None = None


@dataclass(frozen=True, kw_only=True)
class Waiting:
    """A wake that cannot be granted yet, and why."""

    pod: str
    model: str
    need: int
    """The device memory it needs beyond what it holds asleep."""
    making_room: bool
    """Members are being put to sleep for it (or sleeps under way free its room); False:
    no room can be made for it now, and it takes nothing from the wakes after it."""
    reason: str
    abandoned: bool = False
    """Its requests are gone: it waits only for free room (WakeAsk.abandoned)."""


class RoomKind(StrEnum):
    """What a member is put to sleep to make room for (also the eviction metric's reason)."""

    WAKE = "wake"
    """A member's wake: `RoomFor.subject` names it."""
    START = "start"
    """A member that starts: `RoomFor.subject` names it."""
    BOOKS = "books"
    """The pool's books count more than its device holds (a member it no longer trusts to
    free its memory counts whole): room is made to make them good."""
    HEADROOM = "headroom"
    """Wakes to come: room kept free ahead of need."""
    PRIME = "prime"
    """Nothing: it sleeps at level 1 only to pin its host copy, and is woken back at once."""


@dataclass(frozen=True)
class RoomFor:
    """What a member's sleep makes room for: a kind, and the member it is for (a pod's name,
    for a wake or a start). Never a string parsed back: a model or a pod may be named like
    any word the pool uses for itself."""

    kind: RoomKind
    subject: str = ""

    @property
    def promised(self) -> bool:
        """Its room is promised to a wake or a start: a request for the member must not
        cancel its drain (headroom's and a prime's are not: their room waits for nobody)."""
        return self.kind in (RoomKind.WAKE, RoomKind.START, RoomKind.BOOKS)


HEADROOM = RoomFor(RoomKind.HEADROOM)
PRIME = RoomFor(RoomKind.PRIME)
BOOKS = RoomFor(RoomKind.BOOKS)


@dataclass(frozen=True, kw_only=True)
class PoolDecision:
    grant: frozenset[str]
    """Members that may wake now."""
    evict: Mapping[str, RoomFor]
    """Members to put to sleep now, with what they make room for."""
    levels: Mapping[str, int]
    """The level each awake member sleeps at if it sleeps now (host memory may force 2)."""
    waiting: Sequence[Waiting]
    used: int
    """Device memory held now (draining members at their footprint; starting members that
    do not fit hold nothing: their engine refuses to load until room is made)."""
    unplaced: frozenset[str] = frozenset()
    """Starting members for which the device has no room yet (in pod-name order, those that
    fit beside the others take their footprint first)."""
