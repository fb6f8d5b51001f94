"""The pictures `snooze whatif` draws: each policy's devices held against its requests held,
and a plan's candidate packings, devices against the p99 latency they add."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from snooze.extras import install_command
from snooze.whatif.report import Result


class PlotError(RuntimeError):
    """The picture cannot be drawn (matplotlib is missing)."""


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotError(
            f"matplotlib is not installed, so no picture was drawn: {install_command('demo')} "
            "(the table and the JSON line are complete without it)"
        ) from None
    return plt


def policies(results: Sequence[Result], path: Path, *, title: str) -> None:
    """Device-hours held against requests held, one labelled point per policy; a hollow mark
    at its engine-hours awake shows what sleep gave back that only a neighbour can use."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for r in results:
        ax.scatter(r.device_hours_held, r.held_requests, s=40)
        ax.scatter(r.gpu_hours_awake, r.held_requests, s=30, facecolors="none",
                   edgecolors="grey", linewidths=0.8)  # fmt: skip
        ax.annotate(r.name, (r.device_hours_held, r.held_requests), xytext=(5, 4),
                    textcoords="offset points", fontsize=8)  # fmt: skip
    always_on = max((r.gpu_hours_always_on for r in results), default=0.0)
    if always_on:
        ax.axvline(always_on, color="grey", linestyle=":", linewidth=1)
        ax.annotate("always on", (always_on, 0), xytext=(-4, 4), textcoords="offset points",
                    fontsize=8, color="grey", ha="right")  # fmt: skip
    ax.set_xlabel(
        "device-hours held (filled; hollow: engine-hours awake, from a wake's start to a "
        "sleep's end)",
        fontsize=8,
    )
    ax.set_ylabel("requests held (for a wake, room in a pool or a cold start)")
    _finish(fig, ax, path, title)


def plan(
    points: Sequence[tuple[int, float, bool]], target: float, path: Path, *, title: str
) -> None:
    """One point per candidate packing the search tried: its devices against the worst p99
    added latency of its models; the target as a line, the chosen packing circled."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 5))
    met = [(d, p) for d, p, ok in points if p <= target]
    over = [(d, p) for d, p, ok in points if p > target]
    if met:
        ax.scatter(*zip(*met, strict=True), s=30, color="tab:green", label="meets the target")
    if over:
        ax.scatter(*zip(*over, strict=True), s=30, color="tab:red", marker="x",
                   label="misses the target (a replay cut short: at least this)")  # fmt: skip
    chosen = [(d, p) for d, p, ok in points if ok]
    if chosen:
        ax.scatter(*zip(*chosen, strict=True), s=160, facecolors="none", edgecolors="black",
                   label="the plan")  # fmt: skip
    ax.axhline(target, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("devices")
    ax.set_ylabel("p99 added latency of the worst model (s)")
    ax.legend(fontsize=8)
    _finish(fig, ax, path, title)


def _finish(fig: Any, ax: Any, path: Path, title: str) -> None:
    ax.set_title(title, fontsize=10)
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    fig.clf()
    import matplotlib.pyplot as plt

    plt.close(fig)
