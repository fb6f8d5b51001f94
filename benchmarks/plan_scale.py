"""How long `snooze whatif plan` takes for many models: the ServeGen trace's 17 streams, each
copied with its days turned by one and two days (so 51 streams with the same shapes at other
times), the first N of them planned onto 80 GiB devices at 36 GiB a model.

    python benchmarks/plan_scale.py [--models 50] [--target 2s]

Prints one JSON line: models, devices found, pools replayed, seconds. Not a test: minutes.
"""

from __future__ import annotations

import argparse
import json
import time
from array import array
from pathlib import Path

from snooze.api.durations import parse_duration
from snooze.whatif import plan, policies, trace
from snooze.whatif.latency import Latencies
from snooze.whatif.layout import PoolFlags
from snooze.whatif.pooling import Footprint

ROOT = Path(__file__).resolve().parents[1]
DAY = 86400.0
GIB = 2**30


def turned(column: trace.ModelRequests, days: int, span: float, name: str) -> trace.ModelRequests:
    """The stream with every request `days` later, wrapped around the trace's span."""
    pairs = sorted(
        ((at + days * DAY) % span, tokens)
        for at, tokens in zip(column.at, column.tokens, strict=True)
    )
    return trace.ModelRequests(
        name=name, at=array("d", (a for a, _ in pairs)), tokens=array("i", (t for _, t in pairs))
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=int, default=50)
    parser.add_argument("--target", default="2s")
    args = parser.parse_args()
    source = trace.read(ROOT / "traces" / "servegen-14d-17m.csv.gz")
    span = 14 * DAY
    models: dict[str, trace.ModelRequests] = {}
    for days in (0, 1, 2):
        for name, column in source.models.items():
            copy = f"{name}-{days}" if days else name
            models[copy] = turned(column, days, span, copy) if days else column
    chosen = dict(list(models.items())[: args.models])
    requests = trace.Trace(models=chosen)
    settings = plan.PlanSettings(
        device_memory=80 * GIB,
        sizes=dict.fromkeys(chosen, Footprint(memory=36 * GIB, asleep=2 * GIB, weights=34 * GIB)),
        target=parse_duration(args.target),
        pool=PoolFlags(),
        member=policies.parse("always-on").spec,
        latencies=Latencies(),
        measure_from=7 * DAY,
    )
    began = time.perf_counter()
    found = plan.search(requests, settings)
    print(
        json.dumps(
            {
                "models": len(chosen),
                "requests": len(requests),
                "devices": found.devices,
                "worst_p99_s": round(found.worst, 3),
                "replays": found.replays,
                "search_s": round(time.perf_counter() - began, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
