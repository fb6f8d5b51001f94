"""What a fixed TTL would have cost on the demo's own traffic: the requests the demo sent,
replayed through `snooze whatif`'s engine (the operator's policy on a simulated clock) with each
model's idle.after as a fixed TTL, each model on GPUs of its own, next to what Snooze did."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from snooze.demo.scenario import TOKENS, ModelPlan, Scenario
from snooze.demo.timeline import Timeline
from snooze.demo.traffic import Record
from snooze.models import NEVER, SleepSpec
from snooze.whatif import policies
from snooze.whatif.latency import Latencies
from snooze.whatif.simulate import Simulation
from snooze.whatif.trace import Request

ASLEEP = {"asleep", "absent"}
"""Pod states in which an engine holds no awake GPU memory; all others count as awake, as
whatif counts an engine awake from the start of its wake (or load) to the end of its sleep."""


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """One model: the fixed TTL replayed by whatif, and what Snooze did in the run."""

    model: str
    policy: str
    """The whatif policy: `fixed:IDLE`, or `always-on` for idle.after: Never."""
    requests: int
    ttl_gpu_hours: float
    """Engine-hours awake under the fixed TTL (whatif)."""
    ttl_held: int
    """Requests that found no engine awake under the fixed TTL (whatif)."""
    snooze_gpu_hours: float
    """Engine-hours awake in the run (its timeline)."""
    snooze_held: int
    """Requests the gateway held in the run."""
    pool: str | None = None


def policy_for(plan: ModelPlan) -> policies.Policy:
    """The model's idle.after as a fixed TTL, parsed as `snooze whatif --policy` parses it, at
    the model's own sleep level (a level-2 wake reloads the weights)."""
    idle = plan.spec["idle"]["after"]
    parsed = policies.parse("always-on" if idle == NEVER else f"fixed:{idle}")
    level = int(plan.spec["sleep"]["level"])
    spec = parsed.spec.model_copy(update={"sleep": SleepSpec(level=level)})
    return policies.Policy(name=parsed.name, spec=spec, engines=plan.replicas)


def latencies_of(plan: ModelPlan) -> Latencies:
    """The model's engine latencies in the run, as whatif takes them."""
    e = plan.engine
    return Latencies(
        sleep_seconds=e["sleep_seconds"],
        level2_sleep_seconds=e["level2_sleep_seconds"],
        wake_seconds=e["wake_seconds"],
        kv_wake_seconds=e["kv_wake_seconds"],
        reload_seconds=e["reload_seconds"],
        cold_start_seconds=e["startup_seconds"],
        token_seconds=e["token_seconds"],
        output_tokens=TOKENS,
    )


def awake_seconds(timeline: Timeline, model: str) -> float:
    """Engine-seconds the model's pods spent in a state other than asleep or absent (pure)."""
    total = 0.0
    for here, after in itertools.pairwise(timeline.samples):
        awake = sum(1 for p in here.pods.values() if p.model == model and p.state not in ASLEEP)
        total += awake * (after.t - here.t)
    return total


def compare(
    scenario: Scenario, records: Sequence[Record], timeline: Timeline, *, end: float
) -> list[Comparison]:
    """Each model that had requests: its requests replayed over [0, end] under its fixed TTL,
    beside the run's own figures over the same span."""
    rows = []
    for plan in scenario.models:
        mine = [r for r in records if r.model == plan.name]
        if not mine:
            continue
        policy = policy_for(plan)
        trace = [Request(at=r.sent, model=plan.name, output_tokens=TOKENS) for r in mine]
        outcome = Simulation(
            spec=policy.spec,
            requests=sorted(trace, key=lambda r: r.at),
            latencies=latencies_of(plan),
            engines=policy.engines or 1,
            start=0.0,
            end=end,
        ).run()
        rows.append(
            Comparison(
                model=plan.name,
                policy=policy.name,
                requests=len(mine),
                ttl_gpu_hours=outcome.gpu_seconds_awake / 3600,
                ttl_held=len(outcome.held),
                snooze_gpu_hours=awake_seconds(timeline, plan.name) / 3600,
                snooze_held=sum(1 for r in mine if r.held > 0),
                pool=plan.pool,
            )
        )
    return rows


def lines(rows: Sequence[Comparison], *, gpus_fixed: int, gpus_snooze: int) -> list[str]:
    """The comparison for the terminal, clearly labelled (pure)."""
    header = (
        f"{'model':<17} {'fixed TTL (whatif)':<19} {'GPU-h awake':>11} {'held':>7}   "
        f"{'Snooze (this run)':<17} {'GPU-h awake':>11} {'held':>7}"
    )
    out = [
        "What a fixed TTL would have cost on this run's own traffic: its requests replayed "
        "through snooze whatif's engine (the operator's policy on a simulated clock, the "
        "engines' latencies of this run) with each model's idle.after as a fixed TTL, each "
        "model on GPUs of its own; beside it, what Snooze did (measured in this run).",
        header,
        "-" * len(header),
    ]
    for r in rows:
        note = f"GPUPool {r.pool}" if r.pool else ""
        out.append(
            f"{r.model:<17} {r.policy:<19} {r.ttl_gpu_hours:>11.4f} "
            f"{f'{r.ttl_held}/{r.requests}':>7}   {note:<17} {r.snooze_gpu_hours:>11.4f} "
            f"{f'{r.snooze_held}/{r.requests}':>7}"
        )
    requests = sum(r.requests for r in rows)
    out.append("-" * len(header))
    ttl_held = f"{sum(r.ttl_held for r in rows)}/{requests}"
    snooze_held = f"{sum(r.snooze_held for r in rows)}/{requests}"
    out.append(
        f"{'all':<17} {'':<19} {sum(r.ttl_gpu_hours for r in rows):>11.4f} {ttl_held:>7}   "
        f"{'':<17} {sum(r.snooze_gpu_hours for r in rows):>11.4f} {snooze_held:>7}"
    )
    out.append(
        "GPU-h awake: engine-hours from the start of a wake (or load) to the end of a sleep; "
        "held: requests that found no engine awake. GPUs held all along: "
        f"{gpus_fixed} with a fixed TTL (a sleeping engine keeps its GPU), {gpus_snooze} with "
        "Snooze (a pool's members share one)."
    )
    return out


def as_json(rows: Sequence[Comparison]) -> list[dict[str, Any]]:
    return [asdict(r) for r in rows]
