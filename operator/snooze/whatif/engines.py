"""What a whatif simulation keeps of one engine (a pod's vLLM), and what it counts per model."""

from __future__ import annotations

import heapq
from array import array
from collections import deque
from dataclasses import dataclass, field

from snooze.api.models import EngineState
from snooze.policy.pool.decision import RECENT_WINDOW_SECONDS
from snooze.policy.sleep import ActionKind


@dataclass(kw_only=True, slots=True)
class Engine:
    pod: str
    index: int
    label: EngineState = EngineState.AWAKE
    sleeping: bool = False
    present: bool = True
    """The pod exists (False while its workload is scaled to zero)."""
    ready_at: float | None = None
    """A pod scaled up is Ready (its engine loaded, awake) at this time."""
    ends: list[float] = field(default_factory=list)
    """When each request in flight ends (a heap): the engine is busy while it is not empty."""
    last_activity: float = 0.0
    action: ActionKind | None = None
    sleep_started: float | None = None
    sleep_level: int | None = None
    awake_since: float | None = None
    """Counted awake from the start of a wake (or a scale-up) to the end of a sleep."""
    resident_since: float | None = None
    """When it last became awake (a pool does not put it to sleep for another member sooner
    than its minResidency after that)."""
    pinned: bool = False
    """Its process holds pinned host blocks from an earlier level-1 sleep: the next one only
    copies (a pod scaled up is a new process, with none)."""
    finished: deque[float] | None = None
    """When its recent requests ended (kept only where a pool orders members by it)."""

    @property
    def running(self) -> int:
        return len(self.ends)

    def serve(self, now: float, seconds: float) -> None:
        heapq.heappush(self.ends, now + seconds)
        self.last_activity = max(self.last_activity, now)

    def retire(self, now: float, *, inclusive: bool) -> float | None:
        """End the requests that ended by `now` (those ending at `now` too when `inclusive`:
        an arrival at the instant a request ends still finds the engine busy); the last end."""
        last = None
        ends = self.ends
        while ends and (ends[0] < now or (inclusive and ends[0] == now)):
            last = heapq.heappop(ends)
            if self.finished is not None:
                self.finished.append(last)
        if last is not None:
            self.last_activity = max(self.last_activity, last)
        return last

    def recent_requests(self, now: float) -> int:
        finished = self.finished
        if finished is None:
            return 0
        while finished and now - finished[0] > RECENT_WINDOW_SECONDS:
            finished.popleft()
        return len(finished)


@dataclass(kw_only=True)
class Outcome:
    """One model under one policy, counted within the measured span."""

    engine_seconds_awake: float = 0.0
    engine_seconds_always_on: float = 0.0
    wakes: int = 0
    cold_starts: int = 0
    requests: int = 0
    held: array[float] = field(default_factory=lambda: array("d"))
    """The added latency of each held request."""
    prewakes: int = 0
    prewake_hits: int = 0
    prewake_misses: int = 0
    swaps: int = 0
    """Its engines put to sleep by their pool to make room (for a wake, or ahead of one)."""
    room_waits: array[float] = field(default_factory=lambda: array("d"))
    """For each wake that asked its pool for room: how long until the pool granted it."""
    unanswered: int = 0
    """Requests still held when the simulation ended (counted held until then)."""

    def add(self, other: Outcome) -> None:
        self.engine_seconds_awake += other.engine_seconds_awake
        self.engine_seconds_always_on += other.engine_seconds_always_on
        self.wakes += other.wakes
        self.cold_starts += other.cold_starts
        self.requests += other.requests
        self.held.extend(other.held)
        self.prewakes += other.prewakes
        self.prewake_hits += other.prewake_hits
        self.prewake_misses += other.prewake_misses
        self.swaps += other.swaps
        self.room_waits.extend(other.room_waits)
        self.unanswered += other.unanswered
