"""Run a policy over a trace and report it: devices held first (what a cluster pays for), then
engine-hours awake, wakes, requests held and their added latency, and a pool's swaps and waits
for room; a table for people and one line of JSON for programs."""

from __future__ import annotations

import json
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from snooze.api.gpupool import Eviction
from snooze.api.models import EngineState
from snooze.whatif.engines import Engine, Outcome
from snooze.whatif.group import Devices, Group, peak
from snooze.whatif.latency import Latencies
from snooze.whatif.layout import Layout, PoolLayout
from snooze.whatif.model import ModelSim
from snooze.whatif.policies import Policy, PolicyError
from snooze.whatif.pooling import PoolSim
from snooze.whatif.trace import Request, Trace


@dataclass(frozen=True, kw_only=True)
class Result:
    name: str
    device_hours_held: float
    devices_peak: int
    gpu_hours_awake: float
    """Engine-hours awake (from the start of a wake to the end of a sleep)."""
    gpu_hours_always_on: float
    wakes: int
    cold_starts: int
    held_requests: int
    added_latency_p50_s: float
    added_latency_p99_s: float
    """Of the held requests."""
    added_latency_p99_all_s: float
    """Of every request (one answered at once adds nothing)."""
    swaps: int
    waits_for_room: int
    wait_for_room_p99_s: float
    unanswered: int
    """Requests never answered: held when the simulation ended (a wake that never got room)."""
    requests: int
    prewakes: int
    prewake_hits: int
    prewake_misses: int
    devices_always_on: int
    per_model: dict[str, Outcome] = field(default_factory=dict)

    def as_json(self) -> dict[str, object]:
        """The fields of the JSON line, in the documented order."""
        return {
            "name": self.name,
            "device_hours_held": round(self.device_hours_held, 4),
            "devices_peak": self.devices_peak,
            "gpu_hours_awake": round(self.gpu_hours_awake, 4),
            "gpu_hours_always_on": round(self.gpu_hours_always_on, 4),
            "wakes": self.wakes,
            "cold_starts": self.cold_starts,
            "held_requests": self.held_requests,
            "added_latency_p50_s": round(self.added_latency_p50_s, 3),
            "added_latency_p99_s": round(self.added_latency_p99_s, 3),
            "added_latency_p99_all_s": round(self.added_latency_p99_all_s, 3),
            "swaps": self.swaps,
            "waits_for_room": self.waits_for_room,
            "wait_for_room_p99_s": round(self.wait_for_room_p99_s, 3),
            "unanswered": self.unanswered,
        }


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile (nearest rank); 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q * len(ordered) + 0.5)))
    return ordered[rank - 1]


def percentile_of_all(held: Sequence[float], requests: int, q: float) -> float:
    """The q-quantile of every request's added latency, where those not held add nothing."""
    total = max(requests, len(held))
    if not total:
        return 0.0
    rank = max(1, min(total, round(q * total + 0.5)))
    zeros = total - len(held)
    return 0.0 if rank <= zeros else sorted(held)[rank - zeros - 1]


def engines_for(policy: Policy, model: str) -> int:
    """One engine per model, or as many as a minAwake (of the spec or a window) asks for."""
    if model in policy.model_engines:
        return policy.model_engines[model]
    if policy.engines is not None:
        return policy.engines
    spec = policy.spec_for(model)
    floors = [spec.min_awake, *(w.min_awake for w in spec.schedule)]
    return max(1, *floors)


def evaluate(
    policy: Policy,
    requests: Trace | Sequence[Request],
    *,
    latencies: Latencies,
    measure_from: float | None = None,
    layout: Layout | None = None,
    span: tuple[float, float] | None = None,
    model_latencies: Mapping[str, Latencies] | None = None,
    give_up_over: float | None = None,
) -> Result:
    """Simulate every model of the trace under `policy` (each on devices of its own, or in
    its pool of `layout`, all on the same clock span: the trace's, or `span`) and add them
    up. `model_latencies`: engines of their own for some models (`latencies` for the rest).
    `give_up_over`: stop with TargetMissed as soon as a model's p99 added latency must be over
    it (the plan's search needs no more)."""
    trace = requests if isinstance(requests, Trace) else Trace.of(requests)
    layout = layout or Layout()
    start, end = span or (trace.first, trace.last)
    measure = start if measure_from is None else measure_from
    names = list(trace.models)
    index = {name: k for k, name in enumerate(names)}

    def sim(name: str, *, recent: bool = False) -> ModelSim:
        spec = policy.spec_for(name)
        model = ModelSim(
            index=index[name],
            spec=spec,
            requests=trace.models[name],
            latencies=(model_latencies or {}).get(name, latencies.for_engine(spec.engine.kind)),
            clock=_NO_CLOCK,
            engines=engines_for(policy, name),
            measure_from=measure,
            start=start,
            end=end,
            recent=recent,
        )
        if give_up_over is not None:
            model.give_up_over(give_up_over, 0.99)
        return model

    groups: list[Group] = []
    pooled: set[str] = set()
    for pool in layout.pools:
        members = [m for m in pool.members if m in trace.models]
        if not members:
            continue
        cheapest = pool.settings.eviction is Eviction.CHEAPEST
        sims = [sim(m, recent=cheapest) for m in members]
        _refuse_scale_to_zero(policy, pool, sims)
        _place(sims, pool)
        pool_sim = PoolSim(pool.settings, sims, pool.members)
        groups.append(Group(sims, pool=pool_sim, start=start, end=end))
        pooled.update(members)
    groups += [
        Group([sim(name)], pool=None, start=start, end=end) for name in names if name not in pooled
    ]
    devices: list[Devices] = []
    per_model: dict[str, Outcome] = {}
    for group in groups:
        devices.append(group.run())
        for model in group.models:
            per_model[model.name] = model.close(group.end)
    return _result(policy.name, per_model, devices, groups)


class _NoClock:
    """Stands for the clock until the model joins its group."""

    def push(self, at: float, kind: str, model: int, engine: int) -> None:
        raise RuntimeError("a model acted before it joined its group")


_NO_CLOCK = _NoClock()


def _refuse_scale_to_zero(policy: Policy, pool: PoolLayout, sims: Sequence[ModelSim]) -> None:
    for model in sims:
        if model.spec.scale_to_zero_after is not None:
            raise PolicyError(
                f"policy {policy.name!r}: {model.name} is in GPUPool {pool.settings.name}, and "
                "whatif does not replay scale to zero inside a pool: compare tiers without "
                "pools, or pools without tiers"
            )


def _place(sims: Sequence[ModelSim], pool: PoolLayout) -> None:
    """The pool at the trace's start: its members awake in the order of their first request
    while they fit beside what the later ones hold asleep; the others asleep (slept before,
    so a level-1 sleeper's process holds its pinned copy)."""
    engines = [
        (model, engine)
        for model in sorted(sims, key=lambda m: (m.requests.at[0], m.index))
        for engine in model.engines
    ]
    sizes = pool.members
    held = 0
    for n, (model, engine) in enumerate(engines):
        size = sizes[model.name]
        later = sum(sizes[m.name].asleep for m, _ in engines[n + 1 :])
        if held + size.memory + later <= pool.settings.memory:
            held += size.memory
            continue
        held += size.asleep
        _asleep(model, engine)


def _asleep(model: ModelSim, engine: Engine) -> None:
    level = model.spec.sleep.level
    engine.label, engine.sleeping, engine.sleep_level = EngineState.ASLEEP, True, level
    engine.awake_since = engine.resident_since = None
    engine.pinned = level == 1


def _result(
    name: str, per_model: dict[str, Outcome], devices: Sequence[Devices], groups: Sequence[Group]
) -> Result:
    total = Outcome()
    for outcome in per_model.values():
        total.add(outcome)
    held = sorted(total.held)
    waits = array("d", (w for w in total.room_waits if w > 0))
    return Result(
        name=name,
        device_hours_held=sum(d.seconds for d in devices) / 3600,
        devices_peak=peak(devices),
        gpu_hours_awake=total.engine_seconds_awake / 3600,
        gpu_hours_always_on=total.engine_seconds_always_on / 3600,
        wakes=total.wakes,
        cold_starts=total.cold_starts,
        held_requests=len(held),
        added_latency_p50_s=percentile(held, 0.5),
        added_latency_p99_s=percentile(held, 0.99),
        added_latency_p99_all_s=percentile_of_all(held, total.requests, 0.99),
        swaps=total.swaps,
        waits_for_room=len(waits),
        wait_for_room_p99_s=percentile(waits, 0.99),
        unanswered=total.unanswered,
        requests=total.requests,
        prewakes=total.prewakes,
        prewake_hits=total.prewake_hits,
        prewake_misses=total.prewake_misses,
        devices_always_on=sum(
            1 if g.pool is not None else len(g.models[0].engines) for g in groups
        ),
        per_model=per_model,
    )


HEAD = (
    "policy",
    "device-h held",
    "of always-on",
    "devices peak",
    "engine-h awake",
    "wakes",
    "cold starts",
    "held",
    "held p50",
    "held p99",
    "p99 all",
)


def table(results: Sequence[Result]) -> str:
    """The comparison, one policy a row, devices held first ("of always-on": of the
    device-hours every model would hold on devices of its own, always on)."""
    pools = any(r.swaps or r.waits_for_room for r in results)
    head = HEAD + (("swaps", "room waits (p99)") if pools else ()) + ("pre-wakes (hit/miss)",)
    rows = [head]
    for r in results:
        reference = r.gpu_hours_always_on
        share = r.device_hours_held / reference if reference else 0.0
        row = [
            r.name,
            f"{r.device_hours_held:.1f}",
            f"{share:.0%}",
            str(r.devices_peak),
            f"{r.gpu_hours_awake:.1f}",
            str(r.wakes),
            str(r.cold_starts),
            f"{r.held_requests} of {r.requests}",
            f"{r.added_latency_p50_s:.2f}s",
            f"{r.added_latency_p99_s:.2f}s",
            f"{r.added_latency_p99_all_s:.2f}s",
        ]
        if pools:
            row += [str(r.swaps), f"{r.waits_for_room} ({r.wait_for_room_p99_s:.2f}s)"]
        row.append(f"{r.prewakes} ({r.prewake_hits}/{r.prewake_misses})" if r.prewakes else "-")
        rows.append(tuple(row))
    return aligned(rows)


def sentences(results: Sequence[Result]) -> str:
    """What the table means for devices, one plain sentence a policy: how many a cluster
    holds on average and at its peak, against every model on devices of its own."""
    lines = []
    for r in results:
        always = r.devices_always_on
        share = r.device_hours_held / r.gpu_hours_always_on if r.gpu_hours_always_on else 0.0
        mean = always * share
        saved = always - mean
        if saved < 0.05:
            gain = "no device saved"
        else:
            gain = f"{saved:.1f} saved on average ({1 - share:.0%})"
            gain += (
                f", {always - r.devices_peak} at the peak"
                if r.devices_peak < always
                else (", none at the peak, which the cluster must still have")
            )
        held = f"{r.held_requests:,} of {r.requests:,} requests held"
        if r.held_requests:
            held += f" (p99 {r.added_latency_p99_s:.2f}s added)"
        lines.append(
            f"{r.name}: {mean:.1f} devices held on average, {r.devices_peak} at the peak, "
            f"against {always} always on: {gain}; {held}."
        )
    return "\n".join(lines)


def aligned(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for n, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)
        ]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def json_line(results: Sequence[Result]) -> str:
    return json.dumps({"policies": [r.as_json() for r in results]})
