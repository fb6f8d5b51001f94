"""What each policy saves and costs on a shipped trace, learning on its first week and counting
its second: devices held, engine-hours awake, requests held; and pre-wake judged against the
best fixed TTL at equal cost on the models with a daily pattern.

    python benchmarks/savings.py [--trace traces/servegen-14d-17m.csv.gz] [--models m02,m04,m08]

Pre-wake against fixed TTLs, twice: at equal device-hours (each model's pods scaled to zero
after a keep-alive Z, idle.after 5m before that, with and without pre-wake: on a device of its
own only scale to zero gives devices back), and at equal engine-hours awake (sleep only, the
room a pool's neighbours can use). For each pre-wake setting, the fixed one to beat is the
cheapest that costs no less; the goal is 30% fewer requests held. Prints JSON lines: the sweep
over all models, then one per model of `--models` and their total. Not a test: a few minutes.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from snooze.whatif import policies, report, trace
from snooze.whatif.latency import Latencies

ROOT = Path(__file__).resolve().parents[1]
WEEK = 7 * 86400.0
SWEEP = [
    "always-on",
    *(f"fixed:{d}" for d in ("1m", "5m", "10m", "30m", "1h", "2h")),
    *(f"tiers:10m,{z}" for z in ("1h", "2h", "6h", "24h")),
    "auto",
    "prewake:2m,5m",
    "prewake:2m,Auto",
]
ZERO_AFTER = ["10m", "15m", "30m", "1h", "2h", "4h", "8h", "24h"]
FIXED = ["1m", "2m", "5m", "10m", "15m", "30m", "1h", "2h", "4h"]
PREWAKE_IDLE = ["1m", "2m", "5m", "10m", "Auto"]
GOAL = 0.3


def figures(r: report.Result) -> dict[str, Any]:
    hours = 7 * 24
    return {
        "name": r.name,
        "device_hours": round(r.device_hours_held, 1),
        "devices_mean": round(r.device_hours_held / hours, 2),
        "devices_peak": r.devices_peak,
        "engine_hours_awake": round(r.gpu_hours_awake, 1),
        "held": r.held_requests,
        "requests": r.requests,
        "p99_added_s": round(r.added_latency_p99_all_s, 2),
        "held_p99_s": round(r.added_latency_p99_s, 2),
        "cold_starts": r.cold_starts,
        "prewakes": r.prewakes,
    }


def scaled(name: str, zero: str, *, prewake: bool) -> policies.Policy:
    """idle.after 5m, then zero replicas `zero` after the last request; with or without a
    pre-wake 2m ahead (a cold start takes 60 s)."""
    raw: dict[str, Any] = {
        "idle": {"after": "5m"},
        "scaleTargetRef": policies.TARGET,
        "scaleToZeroAfter": zero,
    }
    if prewake:
        raw["prewake"] = {"lead": "2m"}
    return policies.policy_of(name, raw)


def against(
    contenders: Sequence[report.Result], fixed: Sequence[report.Result], cost: str
) -> list[dict[str, Any]]:
    """Each pre-wake setting against the cheapest fixed one that costs no less."""
    rows = []
    for pre in contenders:
        spend = getattr(pre, cost)
        rivals = [f for f in fixed if getattr(f, cost) >= spend]
        best = min(rivals, key=lambda f: getattr(f, cost)) if rivals else None
        reduction = (
            None
            if best is None or not best.held_requests
            else round(1 - pre.held_requests / best.held_requests, 3)
        )
        rows.append(
            {
                "prewake": pre.name,
                cost: round(spend, 1),
                "held": pre.held_requests,
                "hits": pre.prewake_hits,
                "misses": pre.prewake_misses,
                "fixed": None if best is None else best.name,
                f"fixed_{cost}": None if best is None else round(getattr(best, cost), 1),
                "fixed_held": None if best is None else best.held_requests,
                "held_reduction": reduction,
            }
        )
    return rows


def judge(requests: trace.Trace, label: str, span: tuple[float, float]) -> dict[str, Any]:
    def run(policy: policies.Policy) -> report.Result:
        return report.evaluate(
            policy, requests, latencies=Latencies(), measure_from=span[0] + WEEK, span=span
        )

    zero_fixed = [run(scaled(f"zero:{z}", z, prewake=False)) for z in ZERO_AFTER]
    zero_pre = [run(scaled(f"prewake+zero:{z}", z, prewake=True)) for z in ZERO_AFTER]
    awake_fixed = [run(policies.parse(f"fixed:{d}")) for d in FIXED]
    awake_pre = [run(policies.parse(f"prewake:2m,{d}")) for d in PREWAKE_IDLE]
    by_devices = against(zero_pre, zero_fixed, "device_hours_held")
    by_awake = against(awake_pre, awake_fixed, "gpu_hours_awake")
    best = [row["held_reduction"] for row in by_devices if row["held_reduction"] is not None]
    return {
        "models": label,
        "requests_counted": zero_fixed[0].requests,
        "at_equal_device_hours": by_devices,
        "at_equal_engine_hours": by_awake,
        "best_reduction_at_equal_device_hours": max(best, default=None),
        "goal_met": any(r >= GOAL for r in best),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, default=ROOT / "traces" / "servegen-14d-17m.csv.gz")
    parser.add_argument("--models", default="m02,m04,m08")
    args = parser.parse_args()
    requests = trace.read(args.trace)
    # The source's clock starts the trace: the first week is days 1 to 7, from its day start.
    start = requests.first - requests.first % 86400
    span = (start, requests.last)
    sweep = [
        figures(
            report.evaluate(
                policies.parse(text),
                requests,
                latencies=Latencies(),
                measure_from=start + WEEK,
                span=span,
            )
        )
        for text in SWEEP
    ]
    print(json.dumps({"trace": args.trace.name, "counted_from_day": 8, "policies": sweep}))
    chosen = args.models.split(",")
    for model in chosen:
        alone = trace.Trace(models={model: requests.models[model]})
        print(json.dumps(judge(alone, model, span)))
    together = trace.Trace(models={m: requests.models[m] for m in chosen})
    print(json.dumps(judge(together, "+".join(chosen), span)))


if __name__ == "__main__":
    main()
