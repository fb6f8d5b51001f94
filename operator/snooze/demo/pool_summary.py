"""The pool scene's summary, pure: swaps, waits for room, out-of-memory wakes, and the GPUs the
pool's members needed against one GPU per model."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from snooze.demo.summary import percentile
from snooze.demo.timeline import GIB, Timeline


@dataclass(frozen=True, kw_only=True)
class PoolSummary:
    pool: str
    members: tuple[str, ...]
    memory_gib: float
    footprint_gib: float
    """One member's awake footprint."""
    swaps: int
    """Members put to sleep to make room for another member's wake."""
    start_evictions: int
    """Members put to sleep to make room for a member that started."""
    wake_waits: tuple[float, ...]
    """Each member wake's wait for room, ask to grant (the operator's own measure)."""
    ooms: int
    """Wakes of members that ran out of device memory, as the operator counted them."""
    device_wake_ooms: int
    """Wakes the simulated GPU refused for want of memory: the engines' own count."""
    device_start_refusals: int
    """Engine starts the simulated GPU refused for want of memory."""
    most_awake: int
    """The most members holding more than their asleep residue at once (the device's count)."""
    peak_used_gib: float

    @property
    def gpus_one_per_model(self) -> int:
        return len(self.members)

    @property
    def wait_p50(self) -> float | None:
        return percentile(self.wake_waits, 50)

    @property
    def wait_p99(self) -> float | None:
        return percentile(self.wake_waits, 99)


def device_counts(
    timeline: Timeline, pool: str, members: Sequence[str], *, asleep_bytes: int
) -> tuple[int, float]:
    """The most members awake at once on the pool's device (holding more than an asleep
    engine does) and the most memory used, in GiB, over the samples (pure)."""
    most, peak = 0, 0.0
    for sample in timeline.samples:
        seen = sample.pools.get(pool)
        if seen is None:
            continue
        most = max(most, sum(1 for m in members if seen.held.get(m, 0) > asleep_bytes))
        peak = max(peak, (seen.memory_bytes - seen.free_bytes) / GIB)
    return most, peak


def lines(summary: PoolSummary) -> list[str]:
    """What the pool did, for the terminal (pure)."""
    s = summary
    waits = (
        f"p50 {s.wait_p50:.2f}s, p99 {s.wait_p99:.2f}s over {len(s.wake_waits)} wakes"
        if s.wait_p50 is not None and s.wait_p99 is not None
        else "no wake asked"
    )
    return [
        f"GPUPool {s.pool}: {len(s.members)} models ({', '.join(s.members)}) of "
        f"{s.footprint_gib:g} GiB each on one GPU of {s.memory_gib:g} GiB: 1 GPU where one GPU "
        f"per model takes {s.gpus_one_per_model}",
        f"  swaps: {s.swaps} members put to sleep to make room for a wake, and {s.start_evictions} "
        f"for members that started; wait for room (ask to grant): {waits}",
        f"  at most {s.most_awake} awake at once, {s.peak_used_gib:.0f} of {s.memory_gib:g} GiB "
        f"used at the peak; wakes out of memory: {s.ooms} (snooze_pool_oom_total), "
        f"{s.device_wake_ooms} (the simulated GPU's count); engine starts refused for want of "
        f"room: {s.device_start_refusals}",
    ]


def as_json(summary: PoolSummary) -> dict[str, Any]:
    body = asdict(summary)
    body |= {
        "wait_p50": summary.wait_p50,
        "wait_p99": summary.wait_p99,
        "gpus_one_per_model": summary.gpus_one_per_model,
        "gpus": 1,
    }
    return body
