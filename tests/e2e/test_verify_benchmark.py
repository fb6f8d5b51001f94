"""benchmarks/verify.py runs as benchmarks/README.md prints it, here with tiny settings (0.1 GiB
of weights, two rounds of wakes), and its last line is a JSON report whose figures add up."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WHEELS = ROOT / ".cache" / "vllm-wheels"


def test_the_verify_benchmark_reports_both_costs() -> None:
    if not sorted(WHEELS.glob("vllm-0.33.0-*.whl")):
        # What the benchmark says to run when the wheel is missing (the image tests keep the
        # same cache).
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "vllm==0.33.0",
             "-d", str(WHEELS)],
            check=True,
            timeout=600,
        )  # fmt: skip
    done = subprocess.run(
        [sys.executable, "verify.py", "--gib", "0.1", "--rounds", "2"],
        cwd=ROOT / "benchmarks",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    weights = report["weights"]
    assert weights["measured"]["tensors"] % 4 == 0 and weights["measured"]["gib"] >= 0.1
    per_gib = weights["hash_seconds_per_gib"]
    assert per_gib > 0
    eight = weights["per_model_bf16"]["8B"]
    assert eight["tp1_s"] > eight["tp8_s"] > 0  # the ranks hash in parallel
    output = report["output"]
    assert output["rounds"] == 2
    assert set(output["first_byte_p50_s"]) == {"verify off", "verify on"}
    # The checked model's records (its first sleep) and checks (its two wakes) were timed.
    assert output["operator_output_check_ms"]["count"] >= 3
    assert output["operator_output_check_ms"]["mean"] > 0
