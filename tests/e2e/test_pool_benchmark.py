"""benchmarks/pools.py runs as benchmarks/README.md prints it, here with tiny settings (three
models on one pool where two fit, two minutes of trace at twenty times speed), and its last
line is a JSON report whose figures add up and agree with its per-request log."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from pool_trace import Request, forced_waits, oversubscribed  # noqa: E402


def test_the_pools_benchmark_reports_figures_that_add_up(tmp_path: Path) -> None:
    command = [
        sys.executable, "pools.py", "--models", "3", "--pools", "1", "--minutes", "2",
        "--time-scale", "20", "--bursts-per-hour", "600", "--headroom", "20s", "--prime", "10s",
        "--logs", str(tmp_path),
    ]  # fmt: skip
    done = subprocess.run(
        command, cwd=ROOT / "benchmarks", capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])

    requests = report["requests"]
    assert requests["sent"] == 54  # the seeded trace: the same requests on every run
    assert requests["answered"] + requests["failed"] == requests["sent"]
    assert requests["baseline_answered"] == requests["sent"]
    assert report["gpus"] == {"pools": 1, "one_per_model": 3}
    by_state = report["added_seconds_by_state_at_send"]
    assert sum(s["requests"] for s in by_state.values()) == requests["answered"]
    # Two of the three fit: the one left asleep at the start is woken for its requests.
    assert report["per_hour"]["wakes"] > 0
    # The operator's own timings of those sleeps and wakes, in trace seconds, are read back.
    assert report["wake_seconds_measured_mean"] > 0
    assert report["sleep_seconds_measured_mean"] > 0
    assert report["wake_ooms"]["trace"] == 0
    assert report["start_refusals"]["trace"] == 0
    assert report["target"]["models_per_gpu_at_least_4"] is False
    assert report["scenario"]["headroom_idle_after"] == "20s"
    assert report["scenario"]["prime_idle_after"] == "10s"
    # All three models are wanted within most minutes of this trace, and two fit.
    assert report["oversubscribed"]["requests"] == 45
    assert 0 <= report["forced_over_limit"]["requests"] <= report["oversubscribed"]["requests"]
    assert set(report["evictions_metric"]["trace"]) == {
        "wake",
        "start",
        "books",
        "headroom",
        "prime",
    }

    logged = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert len(logged) == requests["sent"]
    assert sum(1 for r in logged if not r["error"]) == requests["answered"]
    assert (tmp_path / "events.jsonl").read_text()


def test_oversubscribed_counts_requests_while_more_models_are_wanted_than_fit() -> None:
    # One pool where two fit: c comes while a and b were asked within the minute, and d's
    # pool (the other one) has only d; a's request at 200 s finds the others quiet again.
    def two_fit(active: frozenset[int]) -> bool:
        return len(active) <= 2

    trace = [Request(at=t, model=m, tokens=16) for t, m in [(0, 0), (10, 2), (20, 4), (30, 1)]]
    trace.append(Request(at=200, model=0, tokens=16))
    assert oversubscribed(trace, pools=2, fits=two_fit) == 1  # model 4 at 20 s: 0, 2, 4
    assert oversubscribed(trace, pools=2, fits=two_fit, window=5) == 0


def test_forced_waits_count_requests_no_policy_can_serve_in_time() -> None:
    # One pool where two fit, a request of 100 tokens lasting 1 s (0.01 s a token), a wake of
    # 0.3 s, the bound 1.6 s. Models 0 and 2 stream from 0 s (until 10 s and 2 s).
    def two_fit(active: frozenset[int]) -> bool:
        return len(active) <= 2

    def forced(trace: list[tuple[float, int, int]], sleep: float = 0.0) -> int:
        requests = [Request(at=t, model=m, tokens=n) for t, m, n in trace]
        return forced_waits(
            requests,
            pools=1,
            fits=two_fit,
            token_seconds=0.01,
            wake_seconds=0.3,
            bound=1.6,
            sleep_seconds=sleep,
        )

    # Model 4 at 0.5 s: both others busy, the first ends at 2 s: 1.5 + 0.3 > 1.6, forced.
    assert forced([(0, 0, 1000), (0, 2, 200), (0.5, 4, 10)]) == 1
    # At 1.0 s: 1.0 + 0.3 is within the bound (a policy could make it)...
    assert forced([(0, 0, 1000), (0, 2, 200), (1.0, 4, 10)]) == 0
    # ...unless the engine that ends must sleep first, for 0.8 s: 1.0 + 0.8 + 0.3 > 1.6.
    assert forced([(0, 0, 1000), (0, 2, 200), (1.0, 4, 10)], sleep=0.8) == 1
    assert forced([(0, 0, 1000), (0, 2, 200), (1.6, 4, 10)], sleep=0.8) == 0
    # Only one other busy: room for it beside that one.
    assert forced([(0, 0, 1000), (0.5, 4, 10)]) == 0
    # Its own model already streams (it is awake): only that first request of it is forced.
    assert forced([(0, 0, 1000), (0, 2, 200), (0, 4, 1000), (0.5, 4, 10)]) == 1
