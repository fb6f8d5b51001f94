"""benchmarks/pool_replay.py: the pool decision replayed against a trace in simulated time, with
the engines' sleep and wake times; checked on a trace whose waits are computed by hand, and run
as benchmarks/README.md prints it, giving the figures its table shows."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from pool_cluster import footprints  # noqa: E402
from pool_replay import GIB, Replay, Settings, start  # noqa: E402
from pool_trace import Request  # noqa: E402

from snooze.api.gpupool import Eviction  # noqa: E402
from snooze.policy.pool.decision import Prime  # noqa: E402

FIRST_SLEEP, LATER_SLEEP, WAKE = 5.7, 5.7 * (1 - 0.86), 0.3


def waits(prime: Prime | None) -> list[float]:
    # m0 (30 GiB), m1 (34) and m2 (38) on 80 GiB: m1 and m2 start awake, m0 asleep. Each
    # request finds its model asleep and the pool full: the least recently used member sleeps
    # first (m1, then m2, then m0), and only m0 has slept before.
    settings = Settings(
        pool_bytes=80 * GIB,
        min_residency=30.0,
        eviction=Eviction.LEAST_RECENTLY_USED,
        headroom=None,
        prime=prime,
        idle_after=None,
    )
    replay = Replay(settings, start([0, 1, 2], footprints(3), 80 * GIB))
    replay.run([Request(at=t, model=m, tokens=10) for t, m in ((100, 0), (200, 1), (300, 2))])
    return [round(added, 3) for _, added, _ in replay.added]


def test_without_prime_the_first_sleep_of_each_member_is_on_a_request_s_path() -> None:
    assert waits(None) == [FIRST_SLEEP + WAKE, FIRST_SLEEP + WAKE, round(LATER_SLEEP + WAKE, 3)]


def test_with_prime_every_request_waits_for_a_later_sleep_only() -> None:
    # m1 then m2, idle at the start, are primed (slept once, woken back) long before 100 s.
    assert waits(Prime(idle_after=10.0)) == [round(LATER_SLEEP + WAKE, 3)] * 3


# The replay commands benchmarks/README.md prints, and the row of its table each one gives
# (the replay is seeded and runs on a simulated clock: the same figures on every run).
PRINTED = {
    "python pool_replay.py --bursts-per-hour 30 --headroom 1m --min-residency 2s --prime 10s "
    "--seeds 1-10": ("| | **2s, `prime`** | **8** | 4, 0, 0, 8, 0, 1, 0, 3, 1, 0 |", 8),
    "python pool_replay.py --headroom 1m --min-residency 2s --prime 10s --seeds 1-10 "
    "--reaction 0.15 --busy-lag 0.5": (
        "| | 2s, `prime`, with the delays | 6 | 12, 6, 33, 0, 0, 10, 3, 6, 1, 0 |",
        6,
    ),
    "python pool_replay.py --bursts-per-hour 30 --headroom 1m --min-residency 2s --prime 10s "
    "--seeds 1-10 --reaction 0.15 --busy-lag 0": (
        "| | 2s, `prime`, with the control path only (`/idle`: `--busy-lag 0`) | 8 "
        "| 4, 0, 0, 11, 0, 1, 0, 4, 1, 0 |",
        8,
    ),
}


@pytest.mark.parametrize("command", sorted(PRINTED))
def test_the_replay_runs_as_printed_and_gives_the_readme_s_figures(command: str) -> None:
    readme = (ROOT / "benchmarks" / "README.md").read_text()
    row, met = PRINTED[command]
    assert f"    {command}\n" in readme and row in readme
    done = subprocess.run(
        [sys.executable, *shlex.split(command)[1:]],
        cwd=ROOT / "benchmarks",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    *rows, summary = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["seed"] for r in rows] == list(range(1, 11))
    for r in rows:
        assert 0 <= r["over_limit"] <= r["requests"] and r["p50"] <= r["p99"]
    over = ", ".join(str(r["over_limit"]) for r in rows)
    assert f"| {over} |" in row
    assert summary["seeds"] == 10 and summary["met"] == met
