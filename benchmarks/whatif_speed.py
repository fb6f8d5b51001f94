"""whatif's replay against the one it replaced, side by side in one run, on the same trace: the
seconds each takes for the same policies (and whether they agree), and the memory the new one
takes on a trace ten times larger.

    python benchmarks/whatif_speed.py [--before REV] [--policy ...] [--tenfold/--no-tenfold]

The engine before is taken from git (`git archive REV operator`, by default the commit before
the event-to-event engine) and run in its own process, as the new one is; each process reads
the trace and replays every policy, and says its seconds and its peak memory (ru_maxrss).
Prints one JSON line per run and a last line with the ratios. Not a test: minutes.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "traces" / "servegen-14d-17m.csv.gz"
BEFORE = "2140ae9"
"""The last commit with the engine that stepped through every request (whatif/simulate.py)."""
POLICIES = [
    "always-on",
    "fixed:1m",
    "fixed:10m",
    "tiers:10m,2h",
    "auto",
    "prewake",
    "prewake:2m,5m",
]
KEYS = ("gpu_hours_awake", "wakes", "cold_starts", "held_requests", "added_latency_p99_s")

# Runs in the child process, with the package of one side first on its path: reads the trace,
# replays each policy with the engine's defaults, learning on the first half, and prints what
# it measured. Written against what both sides share: trace.read, policies.parse and
# report.evaluate(policy, requests, latencies=..., measure_from=...).
CHILD = r"""
import json, resource, sys, time
from pathlib import Path
from snooze.whatif import policies, report, trace
from snooze.whatif.latency import Latencies

KEYS = json.loads(sys.argv[2])
began = time.perf_counter()
requests = trace.read(Path(sys.argv[1]))
if isinstance(requests, list):
    first, last, count = requests[0].at, requests[-1].at, len(requests)
else:
    first, last, count = requests.first, requests.last, len(requests)
read = time.perf_counter() - began
half = first + (last - first) / 2
results, seconds = [], {}
for text in sys.argv[3:]:
    began = time.perf_counter()
    r = report.evaluate(policies.parse(text), requests, latencies=Latencies(), measure_from=half)
    seconds[text] = round(time.perf_counter() - began, 2)
    results.append({"name": r.name, **{k: round(getattr(r, k), 3) for k in KEYS}})
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"requests": count, "read_s": round(read, 2), "replay_s": seconds,
                  "peak_mib": round(peak, 1), "results": results}))
"""


def package_at(rev: str, into: Path) -> Path:
    """The tree's `operator/` folder as it was at `rev`."""
    archive = subprocess.run(
        ["git", "archive", rev, "operator"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into / "operator"


def run(package: Path, trace: Path, policies: list[str]) -> dict[str, Any]:
    began = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(trace), json.dumps(KEYS), *policies],
        env={"PYTHONPATH": str(package), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"the replay in {package} failed:\n{done.stderr[-2000:]}")
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    out["wall_s"] = round(time.perf_counter() - began, 2)
    return out


def tenfold(source: Path, into: Path) -> Path:
    """The trace ten times over, each copy after the last (140 days, the same 17 models)."""
    with gzip.open(source, "rt") as f:
        lines = [line for line in f if line and line[0].isdigit()]
    span = 14 * 86400
    path = into / "servegen-x10.csv.gz"
    with gzip.open(path, "wt", compresslevel=1) as out:
        out.write("timestamp,model,output_tokens\n")
        for copy in range(10):
            shift = copy * span
            for line in lines:
                at, rest = line.split(",", 1)
                out.write(f"{float(at) + shift:.3f},{rest}")
    return path


def _ratio(old: dict[str, Any], new: dict[str, Any], keep: Any) -> float:
    before = sum(t for p, t in old["replay_s"].items() if keep(p))
    now = sum(t for p, t in new["replay_s"].items() if keep(p))
    return round(before / now, 1) if now else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default=BEFORE, help=f"the engine before (default {BEFORE})")
    parser.add_argument("--policy", action="append", default=None, help="default: seven")
    parser.add_argument("--tenfold", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()
    policies = args.policy or POLICIES
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        before = package_at(args.before, work / "before")
        plain = work / "servegen.csv"  # the engine before reads plain CSV only
        with gzip.open(TRACE, "rb") as src, plain.open("wb") as dst:
            shutil.copyfileobj(src, dst)
        old = run(before, plain, policies)
        new = run(ROOT / "operator", TRACE, policies)
        print(json.dumps({"engine": "before", "rev": args.before, **old}))
        print(json.dumps({"engine": "now", **new}))
        same = old["results"] == new["results"]
        summary: dict[str, Any] = {
            "policies": len(policies),
            "requests": new["requests"],
            "replay_ratio": round(sum(old["replay_s"].values()) / sum(new["replay_s"].values()), 1),
            "wall_ratio": round(old["wall_s"] / new["wall_s"], 1),
            # Pre-wake's share of the gain is the profile's own search (policy/prewake.py),
            # which the operator shares: the engine's alone is the ratio without it.
            "replay_ratio_without_prewake": _ratio(old, new, lambda p: "prewake" not in p),
            "replay_ratio_by_policy": {
                p: round(old["replay_s"][p] / max(new["replay_s"][p], 0.01), 1) for p in policies
            },
            "same_results": same,
        }
        if not same:
            summary["differ"] = [
                (a["name"], k, a[k], b[k])
                for a, b in zip(old["results"], new["results"], strict=True)
                for k in KEYS
                if a[k] != b[k]
            ]
        if args.tenfold:
            big = run(ROOT / "operator", tenfold(TRACE, work), policies)
            print(json.dumps({"engine": "now", "trace": "x10", **big}))
            summary["x10_requests"] = big["requests"]
            summary["x10_peak_mib"] = big["peak_mib"]
            summary["x1_peak_mib"] = new["peak_mib"]
            summary["x10_memory_ratio"] = round(big["peak_mib"] / new["peak_mib"], 2)
            summary["x10_time_ratio"] = round(big["wall_s"] / new["wall_s"], 1)
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
