"""Replay the pools benchmark's trace through the pool decision alone, in simulated time.

No operator, gateway, API or HTTP: `decide_pool` is asked after every event (a request, a
request's end, a sleep or wake confirmed) and every tenth of a second, with exact facts (a
member is busy while it has requests in flight), and its sleeps and wakes take the engine's
times of pool_cluster. What it measures is the policy against the trace: the requests that
no operator overhead explains. `--reaction` adds the operator's own delay to each sleep and
wake, and `--busy-lag` the time it takes to see a member's request end, to set the replay
beside a live run of pools.py (whose overhead counts `--time-scale` times).

Runs in seconds, so that eviction orders and settings can be compared on many seeds:
    python pool_replay.py --bursts-per-hour 30 --seeds 1-10
"""

from __future__ import annotations

import argparse
import heapq
import json
import statistics
from dataclasses import dataclass, field
from typing import Any

from pool_cluster import (
    ASLEEP_GIB,
    KV_WAKE_SECONDS,
    LEVEL2_SLEEP_SECONDS,
    LIMIT,
    SLEEP_SECONDS,
    TOKEN_SECONDS,
    WAKE_SECONDS,
    footprints,
    forced_over_limit,
    percentiles,
    trace_for,
)
from pool_trace import Request

from snooze.api.durations import parse_duration
from snooze.api.gpupool import Eviction
from snooze.policy.pool.decision import (
    PRIME,
    RECENT_WINDOW_SECONDS,
    Headroom,
    Member,
    MemberState,
    PoolView,
    Prime,
    WakeAsk,
    decide_pool,
)
from snooze.sim import EngineConfig

GIB = 1 << 30
TICK = 0.1
"""Seconds between two decisions when nothing happens (residency and idleness expire)."""


@dataclass
class Engine:
    """One pooled engine, as the replay keeps it."""

    model: int
    footprint: int
    state: MemberState
    host_copy: bool
    awake_since: float | None = None
    last_used: float = 0.0
    last_end: float = -1e9
    in_flight: int = 0
    finished: list[float] = field(default_factory=list)
    held: list[Request] = field(default_factory=list)
    """Requests that wait for it to be awake."""

    @property
    def name(self) -> str:
        return f"m{self.model}"


@dataclass(frozen=True, kw_only=True)
class Settings:
    pool_bytes: int
    min_residency: float
    eviction: Eviction
    headroom: Headroom | None
    prime: Prime | None
    idle_after: float | None
    reaction: float = 0.0
    busy_lag: float = 0.0
    """Seconds a member still counts busy after its last request ended (the operator learns it
    from the gateway's counters, read once a second while a wake waits)."""
    pinning_share: float = EngineConfig().pinning_share


@dataclass
class Replay:
    """One pool's engines and the clock; `run` drives them through a trace."""

    settings: Settings
    engines: dict[str, Engine]
    now: float = 0.0
    added: list[tuple[Request, float, str]] = field(default_factory=list)
    """Each request, its added latency and the state of its engine when it came."""
    evictions: int = 0
    priming: set[str] = field(default_factory=set)
    """Members put to sleep to pin their copy, to be woken back (a lazy ask)."""
    _events: list[tuple[float, int, str, Any]] = field(default_factory=list)
    _seq: int = 0

    def at(self, when: float, kind: str, what: Any) -> None:
        self._seq += 1
        heapq.heappush(self._events, (when, self._seq, kind, what))

    def run(self, requests: list[Request]) -> None:
        for request in requests:
            self.at(request.at, "request", request)
        end = max((r.at for r in requests), default=0.0)
        tick = 0.0
        while tick <= end or any(e.held for e in self.engines.values()):
            self.at(tick, "tick", None)
            tick += TICK
            if tick > end + 3600:
                raise SystemExit("the replay did not settle within an hour after the trace")
            while self._events and self._events[0][0] <= tick:
                when, _, kind, what = heapq.heappop(self._events)
                self.now = when
                getattr(self, f"_on_{kind}")(what)
                self._decide()

    def _on_tick(self, _: None) -> None:
        if self.settings.idle_after is None:
            return
        for engine in self.engines.values():
            idle = self.now - engine.last_used
            awake = engine.state is MemberState.AWAKE and not engine.in_flight
            if awake and idle >= self.settings.idle_after:  # the model loop's own idle sleep
                self._sleep(engine, 1)

    def _on_request(self, request: Request) -> None:
        engine = self.engines[f"m{request.model}"]
        if engine.state is MemberState.AWAKE:
            self.added.append((request, 0.0, "awake"))
            self._serve(engine, request)
        else:
            engine.held.append(request)

    def _serve(self, engine: Engine, request: Request) -> None:
        engine.in_flight += 1
        engine.last_used = self.now
        self.at(self.now + request.tokens * TOKEN_SECONDS, "done", engine)

    def _on_done(self, engine: Engine) -> None:
        engine.in_flight -= 1
        engine.last_used = engine.last_end = self.now
        engine.finished.append(self.now)

    def _on_slept(self, engine: Engine) -> None:
        engine.state = MemberState.ASLEEP

    def _on_woke(self, engine: Engine) -> None:
        engine.state = MemberState.AWAKE
        engine.awake_since = engine.last_used = self.now
        for request in engine.held:
            self.added.append((request, self.now - request.at, "asleep"))
            self._serve(engine, request)
        engine.held.clear()

    def _sleep(self, engine: Engine, level: int) -> None:
        engine.state = MemberState.DRAINING
        if level == 2:
            seconds = LEVEL2_SLEEP_SECONDS
        elif engine.host_copy:
            seconds = SLEEP_SECONDS * (1 - self.settings.pinning_share)
        else:
            seconds = SLEEP_SECONDS
        engine.host_copy = engine.host_copy or level == 1
        self.at(self.now + seconds + self.settings.reaction, "slept", engine)

    def _member(self, engine: Engine) -> Member:
        recent = sum(1 for t in engine.finished if self.now - t <= RECENT_WINDOW_SECONDS)
        return Member(
            pod=engine.name,
            model=engine.name,
            state=engine.state,
            footprint=engine.footprint,
            residue=ASLEEP_GIB * GIB,
            busy=engine.in_flight > 0 or self.now - engine.last_end < self.settings.busy_lag,
            last_used=engine.last_used,
            awake_since=engine.awake_since,
            wake_seconds=WAKE_SECONDS + KV_WAKE_SECONDS,
            recent_requests=recent,
            host_copy=engine.host_copy,
        )

    def _decide(self) -> None:
        s = self.settings
        asks = [
            WakeAsk(pod=e.name, asked_at=e.held[0].at)
            for e in self.engines.values()
            if e.held and e.state is MemberState.ASLEEP
        ]
        asks += [
            WakeAsk(pod=pod, asked_at=self.now, lazy=True)
            for pod in sorted(self.priming)
            if self.engines[pod].state is MemberState.ASLEEP and not self.engines[pod].held
        ]
        decision = decide_pool(
            PoolView(
                memory=s.pool_bytes,
                host_memory=None,
                eviction=s.eviction,
                min_residency=s.min_residency,
                members=[self._member(e) for e in self.engines.values()],
                asks=asks,
                now=self.now,
                headroom=s.headroom,
                prime=s.prime,
            )
        )
        for pod, why in decision.evict.items():
            self.evictions += 1
            if why == PRIME:
                self.priming.add(pod)
            self._sleep(self.engines[pod], decision.levels.get(pod, 1))
        # A primed member asleep was offered its lazy wake: granted now, or it sleeps on.
        self.priming -= {p for p in self.priming if self.engines[p].state is MemberState.ASLEEP}
        for pod in decision.grant:
            self.engines[pod].state = MemberState.WAKING
            wake = WAKE_SECONDS + KV_WAKE_SECONDS + s.reaction
            self.at(self.now + wake, "woke", self.engines[pod])


def start(models: list[int], sizes: list[int], pool_bytes: int) -> dict[str, Engine]:
    """The pool as the live benchmark starts it: the last members to start awake (they never
    slept, so their first level-1 sleep pins host RAM), the earlier ones put to sleep for them."""
    engines: dict[str, Engine] = {}
    held = 0
    for model in sorted(models, reverse=True):
        footprint = sizes[model] * GIB
        others = ASLEEP_GIB * GIB * (len(models) - len(engines) - 1)
        awake = held + footprint + others <= pool_bytes
        engine = Engine(
            model=model,
            footprint=footprint,
            state=MemberState.AWAKE if awake else MemberState.ASLEEP,
            host_copy=not awake,
        )
        held += footprint if awake else ASLEEP_GIB * GIB
        engines[engine.name] = engine
    return engines


def replay(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    trace = trace_for(args, seed)
    sizes = footprints(args.models)
    settings = settings_of(args)
    added: list[tuple[Request, float, str]] = []
    evictions = 0
    for pool in range(args.pools):
        models = [m for m in range(args.models) if m % args.pools == pool]
        one = Replay(settings, start(models, sizes, settings.pool_bytes))
        one.run([r for r in trace if r.model % args.pools == pool])
        added += one.added
        evictions += one.evictions
    values = [a for _, a, _ in added]
    slow = sorted((r.at, f"m{r.model}", round(a, 2)) for r, a, _ in added if a > LIMIT)
    forced = forced_over_limit(trace, args)
    return {
        "seed": seed,
        "requests": len(values),
        **percentiles(values),
        "over_limit": len(slow),
        "share": round(len(slow) / max(len(values), 1), 4),
        "forced_over_limit": forced,
        "evictions": evictions,
        **({"slow": slow} if args.slow else {}),
    }


def settings_of(args: argparse.Namespace) -> Settings:
    headroom = None
    if args.headroom:
        headroom = Headroom(wakes=1, idle_after=parse_duration(args.headroom))
    return Settings(
        pool_bytes=args.pool_gib * GIB,
        min_residency=parse_duration(args.min_residency),
        eviction=Eviction(args.eviction),
        headroom=headroom,
        prime=Prime(idle_after=parse_duration(args.prime)) if args.prime else None,
        idle_after=None if args.idle_after == "Never" else parse_duration(args.idle_after),
        reaction=args.reaction,
        busy_lag=args.busy_lag,
        pinning_share=args.pinning_share,
    )


def seeds(text: str) -> list[int]:
    first, _, last = text.partition("-")
    return list(range(int(first), int(last or first) + 1))


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Over the seeds: on how many the p99 is within LIMIT, and the means."""
    return {
        "seeds": len(rows),
        "met": sum(1 for row in rows if row["p99"] is not None and row["p99"] <= LIMIT),
        "over_limit_share_mean": round(statistics.mean(r["share"] for r in rows), 4),
        "p99_median": round(statistics.median(r["p99"] for r in rows), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=8)
    parser.add_argument("--pools", type=int, default=2)
    parser.add_argument("--pool-gib", type=int, default=80)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--seeds", type=seeds, default=[1], help="one seed, or a range: 1-10")
    parser.add_argument("--idle-after", default="10m")
    parser.add_argument("--min-residency", default="30s")
    parser.add_argument(
        "--eviction", default="LeastRecentlyUsed", choices=("LeastRecentlyUsed", "Cheapest")
    )
    parser.add_argument("--headroom", default="", help="a headroom's idleAfter, such as 1m")
    parser.add_argument("--prime", default="", help="prime members idle this long, such as 10s")
    parser.add_argument("--reaction", type=float, default=0.0, help="seconds added per action")
    parser.add_argument(
        "--busy-lag", type=float, default=0.0, help="seconds a member still looks busy"
    )
    parser.add_argument("--pinning-share", type=float, default=EngineConfig().pinning_share)
    parser.add_argument("--zipf", type=float, default=1.0)
    parser.add_argument("--bursts-per-hour", type=float, default=60.0)
    parser.add_argument("--burst-seconds", type=float, default=120.0)
    parser.add_argument("--request-gap", type=float, default=5.0)
    parser.add_argument("--slow", action="store_true", help="list the requests over the limit")
    args = parser.parse_args()
    rows = [replay(args, seed) for seed in args.seeds]
    for row in rows:
        print(json.dumps(row))
    print(json.dumps({"replay": "pools", **summary(rows)}))


if __name__ == "__main__":
    main()
