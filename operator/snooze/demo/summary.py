"""The end-of-run summary, pure: per model requests, errors, wakes, held time and GPU time saved."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from snooze.api.reasons import FailureReason
from snooze.demo.timeline import Timeline
from snooze.demo.traffic import Record


@dataclass(frozen=True, kw_only=True)
class ModelSummary:
    model: str
    requests: int
    errors: int
    unanswered: int
    expected_errors: int
    wakes: int
    wake_p50: float | None
    wake_p99: float | None
    held_seconds: float
    asleep_share: float
    restarts: int
    wake_failures: int = 0
    failure_reasons: tuple[str, ...] = ()
    first_failure: float | None = None
    """When the first wake failed, in seconds since the scenario started."""
    serving_again: float | None = None
    """Seconds from the first failed wake until the model had an awake pod again."""


# What ends a failure for good, by the operator's reason: the remedy only recovers the pod.
ADVICE: dict[str, str] = {
    FailureReason.HYBRID_KV_CACHE_REINIT: (
        "run the patched image (images/vllm) or vLLM 0.27.0 or later"
    ),
    FailureReason.TIMEOUT: "raise spec.wake.timeout, or look at why the engine is slow to wake",
    FailureReason.UNREACHABLE: "check that the pod is running and its engine port is reachable",
    FailureReason.ENGINE_ERROR: "read the engine's log",
    FailureReason.SLEEP_MODE_DISABLED: (
        "start vLLM with --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1"
    ),
}


def percentile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank percentile `q` (0 to 100) of `values`; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def asleep_share(timeline: Timeline, model: str, baseline: int) -> float:
    """GPU time given back over always-on: asleep engine-seconds, plus every baseline engine's
    seconds while the model has no pod at all (scaled to zero), over baseline x duration."""
    samples = timeline.samples
    if baseline <= 0 or len(samples) < 2:
        return 0.0
    total = samples[-1].t - samples[0].t
    if total <= 0:
        return 0.0
    saved = 0.0
    for here, after in itertools.pairwise(samples):
        pods = [p for p in here.pods.values() if p.model == model]
        if not pods:
            given_back = baseline
        else:
            # More pods than the baseline (a restart's overlap) never count as extra savings.
            given_back = min(sum(1 for p in pods if p.state == "asleep"), baseline)
        saved += given_back * (after.t - here.t)
    return saved / (baseline * total)


def summarize(
    *,
    records: Sequence[Record],
    timeline: Timeline,
    baselines: Mapping[str, int],
    wakes: Mapping[str, int],
    restarts: Mapping[str, int],
    expected_errors: Mapping[str, int],
) -> list[ModelSummary]:
    """One row per model, in the order of `baselines`."""
    rows = []
    for model, baseline in baselines.items():
        mine = [r for r in records if r.model == model]
        durations = [seconds for _, seconds in timeline.wakes.get(model, [])]
        failures = [i for i in timeline.incidents_of(model) if i.what == "wake failed"]
        first = failures[0].t if failures else None
        again = None if first is None else timeline.serving_again(model, first)
        rows.append(
            ModelSummary(
                model=model,
                requests=len(mine),
                errors=sum(1 for r in mine if not r.ok),
                unanswered=sum(1 for r in mine if r.answered is None),
                expected_errors=expected_errors.get(model, 0),
                wakes=wakes.get(model, 0),
                wake_p50=percentile(durations, 50),
                wake_p99=percentile(durations, 99),
                held_seconds=sum(r.held for r in mine),
                asleep_share=asleep_share(timeline, model, baseline),
                restarts=restarts.get(model, 0),
                wake_failures=len(failures),
                failure_reasons=tuple(dict.fromkeys(i.reason for i in failures)),
                first_failure=first,
                serving_again=None if again is None or first is None else again - first,
            )
        )
    return rows


def failure_lines(rows: Sequence[ModelSummary]) -> list[str]:
    """What failed, what the operator did about it, and what ends it for good (pure)."""
    lines = []
    for r in rows:
        if not r.wake_failures:
            continue
        reasons = ", ".join(r.failure_reasons)
        line = (
            f"{r.model}: {r.wake_failures} wake(s) failed ({reasons}) from {r.first_failure:.1f}s"
        )
        if r.restarts:
            line += f"; remedy: pod restarted {r.restarts}x (wake.onFailure: Restart)"
        if r.serving_again is not None:
            line += f", serving again {r.serving_again:.1f}s after the failure"
        else:
            line += ", not serving again before the end"
        advice = [ADVICE[reason] for reason in r.failure_reasons if reason in ADVICE]
        if advice:
            line += f". To end it for good: {'; '.join(advice)}"
        lines.append(line + ".")
    return lines


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}s"


def table(rows: Sequence[ModelSummary]) -> list[str]:
    """The summary as aligned text lines (pure)."""
    header = (
        f"{'model':<17} {'requests':>8} {'errors':>6} {'wakes':>5} {'failed':>6} {'wake p50':>8} "
        f"{'wake p99':>8} {'held':>7} {'restarts':>8} {'asleep':>7}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        errors = f"{r.errors}" + ("*" if r.expected_errors and r.errors else "")
        lines.append(
            f"{r.model:<17} {r.requests:>8} {errors:>6} {r.wakes:>5} {r.wake_failures:>6} "
            f"{_secs(r.wake_p50):>8} "
            f"{_secs(r.wake_p99):>8} {r.held_seconds:>6.1f}s {r.restarts:>8} "
            f"{r.asleep_share:>7.0%}"
        )
    total = sum(r.requests for r in rows)
    lines.append("-" * len(header))
    lines.append(
        f"{'all':<17} {total:>8} {sum(r.errors for r in rows):>6} {sum(r.wakes for r in rows):>5}"
    )
    lines.append(
        "asleep: share of engine time given back (asleep, or no pod at zero replicas) compared "
        "with always-on; held: total seconds requests waited for a wake; failed: wakes that "
        "failed (a restart's new pod starts awake: no wake)"
    )
    lines.extend(failure_lines(rows))
    if any(r.expected_errors for r in rows):
        lines.append("* errors the scenario expects")
    return lines


def as_json(rows: Sequence[ModelSummary]) -> list[dict[str, Any]]:
    return [asdict(r) for r in rows]
