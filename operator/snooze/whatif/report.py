"""Run every policy over a trace and report: a table for people, a picture of the trade-off
(GPU-hours awake against requests held), and one line of JSON for programs."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from snooze.whatif.latency import Latencies
from snooze.whatif.policies import Policy
from snooze.whatif.simulate import Outcome, Simulation
from snooze.whatif.trace import Request


@dataclass(frozen=True, kw_only=True)
class Result:
    name: str
    gpu_hours_awake: float
    gpu_hours_always_on: float
    wakes: int
    cold_starts: int
    held_requests: int
    added_latency_p50_s: float
    added_latency_p99_s: float
    requests: int
    prewakes: int
    prewake_hits: int
    prewake_misses: int

    def as_json(self) -> dict[str, object]:
        """The fields of the JSON line, in the documented order."""
        return {
            "name": self.name,
            "gpu_hours_awake": round(self.gpu_hours_awake, 4),
            "gpu_hours_always_on": round(self.gpu_hours_always_on, 4),
            "wakes": self.wakes,
            "cold_starts": self.cold_starts,
            "held_requests": self.held_requests,
            "added_latency_p50_s": round(self.added_latency_p50_s, 3),
            "added_latency_p99_s": round(self.added_latency_p99_s, 3),
        }


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile (nearest rank); 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q * len(ordered) + 0.5)))
    return ordered[rank - 1]


def engines_for(policy: Policy) -> int:
    """One engine per model, or as many as a minAwake (of the spec or a window) asks for."""
    if policy.engines is not None:
        return policy.engines
    floors = [policy.spec.min_awake, *(w.min_awake for w in policy.spec.schedule)]
    return max(1, *floors)


def evaluate(
    policy: Policy,
    requests: Sequence[Request],
    *,
    latencies: Latencies,
    measure_from: float | None = None,
) -> Result:
    """Simulate every model of the trace under `policy` (each model on its own engines, on
    the same clock span) and add them up."""
    by_model: dict[str, list[Request]] = {}
    for request in requests:
        by_model.setdefault(request.model, []).append(request)
    start = requests[0].at
    total = Outcome()
    for model_requests in by_model.values():
        out = Simulation(
            spec=policy.spec,
            requests=model_requests,
            latencies=latencies,
            engines=engines_for(policy),
            measure_from=measure_from,
            start=start,
            end=requests[-1].at,
        ).run()
        total.gpu_seconds_awake += out.gpu_seconds_awake
        total.gpu_seconds_always_on += out.gpu_seconds_always_on
        total.wakes += out.wakes
        total.cold_starts += out.cold_starts
        total.requests += out.requests
        total.held.extend(out.held)
        total.prewakes += out.prewakes
        total.prewake_hits += out.prewake_hits
        total.prewake_misses += out.prewake_misses
    return Result(
        name=policy.name,
        gpu_hours_awake=total.gpu_seconds_awake / 3600,
        gpu_hours_always_on=total.gpu_seconds_always_on / 3600,
        wakes=total.wakes,
        cold_starts=total.cold_starts,
        held_requests=len(total.held),
        added_latency_p50_s=percentile(total.held, 0.5),
        added_latency_p99_s=percentile(total.held, 0.99),
        requests=total.requests,
        prewakes=total.prewakes,
        prewake_hits=total.prewake_hits,
        prewake_misses=total.prewake_misses,
    )


def table(results: Sequence[Result]) -> str:
    """The comparison, one policy a row."""
    head = (
        "policy",
        "GPU-h awake",
        "of always-on",
        "wakes",
        "cold starts",
        "held",
        "held p50",
        "held p99",
        "pre-wakes (hit/miss)",
    )
    rows = [head]
    for r in results:
        share = r.gpu_hours_awake / r.gpu_hours_always_on if r.gpu_hours_always_on else 0.0
        rows.append(
            (
                r.name,
                f"{r.gpu_hours_awake:.2f}",
                f"{share:.0%}",
                str(r.wakes),
                str(r.cold_starts),
                f"{r.held_requests} of {r.requests}",
                f"{r.added_latency_p50_s:.2f}s",
                f"{r.added_latency_p99_s:.2f}s",
                f"{r.prewakes} ({r.prewake_hits}/{r.prewake_misses})" if r.prewakes else "-",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = []
    for n, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)
        ]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def json_line(results: Sequence[Result]) -> str:
    return json.dumps({"policies": [r.as_json() for r in results]})


class PlotError(RuntimeError):
    """The picture cannot be drawn (matplotlib is missing)."""


def plot(results: Sequence[Result], path: Path, *, title: str) -> None:
    """GPU-hours awake against requests held, one labelled point per policy."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotError(
            "matplotlib is not installed, so no picture was drawn: pip install 'snooze[demo]' "
            "(the table and the JSON line are complete without it)"
        ) from None
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for r in results:
        ax.scatter(r.gpu_hours_awake, r.held_requests, s=40)
        ax.annotate(r.name, (r.gpu_hours_awake, r.held_requests), xytext=(5, 4),
                    textcoords="offset points", fontsize=8)  # fmt: skip
    always_on = max((r.gpu_hours_always_on for r in results), default=0.0)
    if always_on:
        ax.axvline(always_on, color="grey", linestyle=":", linewidth=1)
        ax.annotate("always on", (always_on, 0), xytext=(-4, 4), textcoords="offset points",
                    fontsize=8, color="grey", ha="right")  # fmt: skip
    ax.set_xlabel("GPU-hours awake (engine awake from the start of a wake to the end of a sleep)")
    ax.set_ylabel("requests held for a wake")
    ax.set_title(title, fontsize=10)
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
