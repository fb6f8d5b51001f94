"""benchmarks/hostile.py runs as benchmarks/README.md prints it, and its last line is a JSON
report whose phases say what the table says: each hostile model ends with its reason on its
status, and the operator's failed probes are counted by that reason."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
COMMAND = "python hostile.py"


def run_as_printed(command: str) -> dict[str, Any]:
    """Run a benchmark as benchmarks/README.md prints it (`Reproduce: ...`); its last line, the
    JSON report."""
    assert f"Reproduce: `{command}`" in (ROOT / "benchmarks" / "README.md").read_text()
    done = subprocess.run(
        [sys.executable, *command.split()[1:]],
        cwd=ROOT / "benchmarks",
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # Said on the test's stdout, which pytest shows when any assertion below fails: a noisy
    # scene's ratio is read best beside the benchmark's own log and the whole report.
    print(done.stderr[-20000:])
    print(done.stdout.splitlines()[-1])
    report: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return report


def test_the_hostile_engines_benchmark_runs_as_printed() -> None:
    report = run_as_printed(COMMAND)

    assert report["rounds"] == 5
    for phase in ("baseline", "huge", "drip", "honest"):
        assert len(report[phase]["wakes"]) == 5
    assert report["huge"]["hostile_status"]["state"] == "unreachable"
    assert "more than 8 MiB" in report["huge"]["hostile_status"]["message"]
    assert "took longer than 5s" in report["drip"]["hostile_status"]["message"]
    assert report["honest"]["hostile_status"]["state"] == "awake"
    assert report["drip"]["hostile_engines"]["count"] == 200
    reasons = {key.rsplit("reason=", 1)[1].strip('"') for key in report["probe_failures"]}
    assert reasons == {"AnswerTooLarge", "Timeout"}

    # The gateway's scenes (hostile_gateway.py), each beside its control.
    gateway = report["gateway"]
    assert gateway["huge"]["answer"]["code"] == 200 and gateway["huge"]["answer"]["mb"] == 300
    assert gateway["huge"]["ratio"] < 1.5 and gateway["huge"]["others"]["failed"] == 0
    assert gateway["unread"]["ratio"] < 3
    lying = gateway["lying"]
    assert lying["stream"]["code"] == lying["whole"]["code"] == lying["next"]["code"] == 502
    assert lying["next"]["s"] < lying["stream"]["s"] < lying["before_s"]
    assert gateway["flood"]["shed"] >= gateway["flood"]["connections"] - 64
