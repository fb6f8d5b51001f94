"""benchmarks/hostile.py's record scene runs as benchmarks/README.md prints it, and its last line
is a JSON report: each wake asked during a first record's 90 s digest came within the control's
time, not the digest's. (The loops and tenants scenes take minutes; what they measure is held
by tests/e2e/test_operator_brakes.py and tests/e2e/test_operator_tenants.py.)"""

from __future__ import annotations

from .test_hostile_benchmark import run_as_printed

COMMAND = "python hostile.py --scene record"


def test_the_record_scene_runs_as_printed() -> None:
    report = run_as_printed(COMMAND)
    assert report["scene"] == "record" and report["checksum_seconds"] == 90
    assert len(report["control_wake_s"]) == len(report["during_record_wake_s"]) == 5
    # Before, each waited for the rest of its digest: 89 s, about 200 times the control.
    assert report["ratio_max"] < 10, report
