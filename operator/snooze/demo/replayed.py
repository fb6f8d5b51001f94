"""What Snooze saved on the demo's own traffic, like with like: the requests the demo sent,
replayed twice through `snooze whatif`'s engine (the operator's policy on a simulated clock,
each model's engine latencies of the run): once with each model's idle.after as a fixed TTL on
devices of its own, once as the scenario deploys it (its GPUPool, its scale to zero). Devices
held first, then engine-hours awake and requests held."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from snooze.api.gpupool import KIND as POOL_KIND
from snooze.api.models import API_VERSION, KIND, NEVER, InferenceModelSpec, SleepSpec
from snooze.demo.scenario import TOKENS, ModelPlan, Scenario
from snooze.demo.traffic import Record
from snooze.whatif import layout, policies, report
from snooze.whatif.latency import Latencies
from snooze.whatif.trace import Request


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """One model, replayed under a fixed TTL on its own devices and as deployed."""

    model: str
    policy: str
    """The fixed TTL: `fixed:IDLE`, or `always-on` for idle.after: Never."""
    requests: int
    ttl_gpu_hours: float
    """Engine-hours awake under the fixed TTL."""
    ttl_held: int
    """Requests that found no engine awake under the fixed TTL."""
    deployed_gpu_hours: float
    """Engine-hours awake as deployed."""
    deployed_held: int
    """Requests held as deployed (for a wake, a pool's room, or a cold start)."""
    pool: str | None = None


@dataclass(frozen=True, kw_only=True)
class Fleet:
    """The whole run's models under one of the two, in devices held."""

    device_hours: float
    devices_peak: int
    devices_always_on: int
    gpu_hours: float
    held: int
    requests: int


def fixed_policy(plan: ModelPlan) -> policies.Policy:
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


def deployed_layout(scenario: Scenario) -> layout.Layout:
    """The scenario's GPUPools and InferenceModels, read as `snooze whatif --pools` reads a
    user's manifests."""
    docs: list[tuple[str, Mapping[str, Any]]] = [
        (f"GPUPool {p.name}", {"kind": POOL_KIND, "metadata": {"name": p.name}, "spec": p.spec})
        for p in scenario.pools
    ]
    for m in scenario.models:
        model = {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": m.name}}
        docs.append((f"InferenceModel {m.name}", {**model, "spec": m.spec}))
    return layout.from_documents(docs)


def compare(
    scenario: Scenario, records: Sequence[Record], *, end: float
) -> tuple[list[Comparison], Fleet, Fleet]:
    """Each model that had requests, replayed over [0, end] under its fixed TTL and as
    deployed; and the two fleets."""
    asked = {m.name for m in scenario.models if any(r.model == m.name for r in records)}
    plans = [m for m in scenario.models if m.name in asked]
    trace = sorted(
        (Request(at=r.sent, model=r.model, output_tokens=TOKENS) for r in records),
        key=lambda r: r.at,
    )
    lat = {m.name: latencies_of(m) for m in plans}
    default = Latencies()
    fixed = {m.name: fixed_policy(m) for m in plans}
    # Each model its own fixed TTL: one replay, a spec per model.
    ttl = report.evaluate(
        _per_model("fixed TTL", {n: p.spec for n, p in fixed.items()}, plans),
        trace,
        latencies=default,
        span=(0.0, end),
        model_latencies=lat,
    )
    deployed = deployed_layout(scenario)
    specs: dict[str, InferenceModelSpec] = {n: s for n, s in deployed.specs.items() if n in asked}
    as_deployed = report.evaluate(
        _per_model("as deployed", specs, plans),
        trace,
        latencies=default,
        span=(0.0, end),
        model_latencies=lat,
        layout=deployed,
    )
    rows = [
        Comparison(
            model=m.name,
            policy=fixed[m.name].name,
            requests=ttl.per_model[m.name].requests,
            ttl_gpu_hours=ttl.per_model[m.name].engine_seconds_awake / 3600,
            ttl_held=len(ttl.per_model[m.name].held),
            deployed_gpu_hours=as_deployed.per_model[m.name].engine_seconds_awake / 3600,
            deployed_held=len(as_deployed.per_model[m.name].held),
            pool=m.pool,
        )
        for m in plans
    ]
    return rows, _fleet(ttl), _fleet(as_deployed)


def _per_model(
    name: str, specs: Mapping[str, InferenceModelSpec], plans: Sequence[ModelPlan]
) -> policies.Policy:
    return policies.Policy(
        name=name,
        spec=policies.parse("always-on").spec,
        per_model=dict(specs),
        model_engines={m.name: m.replicas for m in plans},
    )


def _fleet(result: report.Result) -> Fleet:
    return Fleet(
        device_hours=result.device_hours_held,
        devices_peak=result.devices_peak,
        devices_always_on=result.devices_always_on,
        gpu_hours=result.gpu_hours_awake,
        held=result.held_requests,
        requests=result.requests,
    )


def lines(rows: Sequence[Comparison], ttl: Fleet, deployed: Fleet) -> list[str]:
    """The comparison for the terminal, clearly labelled (pure)."""
    out = [
        "What Snooze saved on this run's own requests, both replayed through snooze whatif's "
        "engine (the operator's policy on a simulated clock, the engines' latencies of this "
        "run; a failed wake is not replayed): each model's idle.after as a fixed TTL on GPUs "
        "of its own, against the models as deployed (GPUPool, scale to zero).",
        f"{'':<27} {'GPU-h held':>10} {'GPUs peak':>9} {'engine-h awake':>14} {'held':>9}",
    ]
    for label, fleet in (("fixed TTL, own GPUs", ttl), ("as deployed", deployed)):
        out.append(
            f"{label:<27} {fleet.device_hours:>10.4f} {fleet.devices_peak:>9} "
            f"{fleet.gpu_hours:>14.4f} {f'{fleet.held}/{fleet.requests}':>9}"
        )
    header = (
        f"{'model':<17} {'fixed TTL':<13} {'engine-h awake':>14} {'held':>7}   "
        f"{'as deployed':<17} {'engine-h awake':>14} {'held':>7}"
    )
    out += [header, "-" * len(header)]
    for r in rows:
        note = f"GPUPool {r.pool}" if r.pool else ""
        out.append(
            f"{r.model:<17} {r.policy:<13} {r.ttl_gpu_hours:>14.4f} "
            f"{f'{r.ttl_held}/{r.requests}':>7}   {note:<17} {r.deployed_gpu_hours:>14.4f} "
            f"{f'{r.deployed_held}/{r.requests}':>7}"
        )
    out.append(
        "GPU-h held: a model's own GPUs while its pods exist (asleep too: only a GPUPool's "
        "members, or scale to zero, give GPUs back), a pool's GPU for all its members; "
        f"GPUs held all along: {ttl.devices_always_on} with a fixed TTL, "
        f"{deployed.devices_always_on} as deployed (a pool's members share one). engine-h "
        "awake: from the start of a wake (or load) to the end of a sleep; held: requests that "
        "found no engine awake."
    )
    return out


def as_json(rows: Sequence[Comparison], ttl: Fleet, deployed: Fleet) -> dict[str, Any]:
    return {
        "models": [asdict(r) for r in rows],
        "fixed_ttl": asdict(ttl),
        "as_deployed": asdict(deployed),
    }
