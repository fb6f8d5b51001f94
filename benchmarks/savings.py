"""What each policy saves and costs on the shipped traces: train on the first half, measure the
second; GPU-hours awake and requests held for always-on, fixed TTLs, tiers, schedules, Auto
and pre-wake; and pre-wake against the best fixed TTL at equal or lower GPU-hours.

    .venv/bin/python benchmarks/savings.py [--trace traces/weekly-mix.csv]

Prints one JSON line per trace. Not a test: it takes a minute or two.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from snooze.whatif import policies, report, trace
from snooze.whatif.latency import Latencies

ROOT = Path(__file__).resolve().parents[1]
FIXED = ["30s", "1m", "2m", "5m", "10m", "15m", "30m", "1h", "2h"]
PREWAKE_IDLE = ["30s", "1m", "2m", "5m", "Auto"]


def sweep(path: Path) -> dict[str, object]:
    requests = trace.read(path)
    half = requests[0].at + (requests[-1].at - requests[0].at) / 2
    specs = ["always-on", *(f"fixed:{d}" for d in FIXED), "tiers:10m,2h", "auto:30s,30m"]
    specs.append(f"schedule:{ROOT / 'traces' / 'office-hours.yaml'}")
    specs += [f"prewake:2m,{idle}" for idle in PREWAKE_IDLE]
    results = {
        spec: report.evaluate(
            policies.parse(spec), requests, latencies=Latencies(), measure_from=half
        )
        for spec in specs
    }
    fixed = [results[f"fixed:{d}"] for d in FIXED]
    comparisons = []
    for idle in PREWAKE_IDLE:
        pre = results[f"prewake:2m,{idle}"]
        # The fixed TTL at equal GPU-hours, from above: the cheapest one that costs no less
        # than pre-wake (a longer TTL holds fewer requests only by costing more).
        rivals = [f for f in fixed if f.gpu_hours_awake >= pre.gpu_hours_awake]
        best = min(rivals, key=lambda f: f.gpu_hours_awake) if rivals else None
        comparisons.append(
            {
                "prewake": pre.name,
                "gpu_hours": round(pre.gpu_hours_awake, 2),
                "held": pre.held_requests,
                "hits": pre.prewake_hits,
                "misses": pre.prewake_misses,
                "best_fixed_at_no_less_gpu": None if best is None else best.name,
                "its_gpu_hours": None if best is None else round(best.gpu_hours_awake, 2),
                "its_held": None if best is None else best.held_requests,
                "held_reduction": None
                if best is None or not best.held_requests
                else round(1 - pre.held_requests / best.held_requests, 3),
            }
        )
    return {
        "trace": path.name,
        "requests_measured": results["always-on"].requests,
        "policies": [
            {
                "name": r.name if not r.name.startswith("schedule:") else "schedule:office-hours",
                "gpu_hours_awake": round(r.gpu_hours_awake, 2),
                "share_of_always_on": round(r.gpu_hours_awake / r.gpu_hours_always_on, 3),
                "held_requests": r.held_requests,
                "wakes": r.wakes,
                "cold_starts": r.cold_starts,
                "prewakes": r.prewakes,
            }
            for r in results.values()
        ],
        "prewake_vs_fixed": comparisons,
        "goal_met": any(
            c["held_reduction"] is not None and float(c["held_reduction"]) >= 0.3  # type: ignore[arg-type]
            for c in comparisons
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--trace", type=Path, action="append", default=None, help="default: traces/*.csv"
    )
    args = parser.parse_args()
    for path in args.trace or sorted((ROOT / "traces").glob("*.csv")):
        print(json.dumps(sweep(path)))


if __name__ == "__main__":
    main()
