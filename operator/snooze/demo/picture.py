"""The timeline's PNG: a row per model (its pods' states, its requests, its GPU memory) and, after
the members of a GPU pool, a row for the pool's memory (held by each member, free)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from snooze.api.models import EngineState
from snooze.demo.timeline import (
    COLOURS,
    FREE,
    MEMBERS,
    OUTCOMES,
    Incident,
    Shown,
    Swap,
    Timeline,
)
from snooze.demo.traffic import Record

ROW_INCHES = 0.42
"""Figure height per unit of a row's height (a lane, or the band of requests above them)."""
POOL_ROW = 4.2
"""A pool's row, in the same units: tall enough to read its memory from."""


def rows(models: Sequence[str], pools: Mapping[str, Sequence[str]]) -> list[tuple[str, str]]:
    """("model", name) per model, and ("pool", name) right after the last member of each pool
    (pure); a pool none of whose members is drawn comes last."""
    out: list[tuple[str, str]] = []
    placed: set[str] = set()
    for model in models:
        out.append(("model", model))
        for pool, members in pools.items():
            if pool not in placed and model in members and model == _last(members, models):
                out.append(("pool", pool))
                placed.add(pool)
    out += [("pool", pool) for pool in pools if pool not in placed]
    return out


def _last(members: Sequence[str], models: Sequence[str]) -> str | None:
    drawn = [m for m in models if m in members]
    return drawn[-1] if drawn else None


def member_colours(pools: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """Each pool member's own colour (pure)."""
    return {
        member: MEMBERS[i % len(MEMBERS)]
        for members in pools.values()
        for i, member in enumerate(members)
    }


def render_png(
    timeline: Timeline,
    records: Sequence[Record],
    models: Sequence[str],
    path: Path,
    *,
    title: str,
    pools: Mapping[str, Sequence[str]] | None = None,
) -> Path:
    """Draw the rows, one above the other on one time axis."""
    import matplotlib

    matplotlib.use("Agg")  # no display: the demo writes a file
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    pools = dict(pools or {})
    layout = rows(models, pools)
    heights = [
        len(timeline.lanes(name)) + 1.7 if kind == "model" else POOL_ROW for kind, name in layout
    ]
    colours = member_colours(pools)
    end = timeline.samples[-1].t if timeline.samples else 1.0
    fig, axes = plt.subplots(
        len(layout),
        1,
        figsize=(12, ROW_INCHES * sum(heights) + 1.3),
        sharex=True,
        squeeze=False,
        gridspec_kw={"height_ratios": heights},
    )
    for ax, (kind, name) in zip((row[0] for row in axes), layout, strict=True):
        if kind == "model":
            _model_row(ax, timeline, records, name, colour=colours.get(name))
        else:
            _pool_row(ax, timeline, name, pools[name], colours)
    last = axes[-1][0]
    last.set_xlim(0, end)
    last.set_xlabel("seconds since the scenario started")
    handles: list[Any] = [Patch(color=c, label=s) for s, c in COLOURS.items()]
    handles += [Patch(color=c, label=f"request: {o}") for o, c in OUTCOMES.items()]
    handles.append(Line2D([], [], color="#424242", lw=1, label="GPU memory (GiB, right)"))
    handles.append(Line2D([], [], color="#212121", marker="x", lw=0, label="pod deleted"))
    if pools:
        handles.append(Patch(color=FREE, label="pool: free memory"))
        handles.append(Line2D([], [], color="#212121", lw=1, ls="--", label="pool: used, counted"))
        handles.append(Line2D([], [], color="#212121", marker="v", lw=0, label="pool: swap"))
    fig.suptitle(title, fontsize=10, y=0.997)
    fig.legend(
        handles=handles,
        loc="upper center",
        ncol=7,
        fontsize=7,
        frameon=False,
        bbox_to_anchor=(0.5, 0.985),
    )
    top = 1 - 0.9 / (ROW_INCHES * sum(heights) + 1.3)
    fig.tight_layout(rect=(0, 0, 1, top))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _model_row(
    ax: Any, timeline: Timeline, records: Sequence[Record], model: str, *, colour: str | None
) -> None:
    lanes = timeline.lanes(model)
    for y, pod in enumerate(lanes):
        spans = timeline.spans(model, pod)
        bars = [(start, stop - start) for start, stop, _ in spans]
        ax.broken_barh(
            bars, (y - 0.35, 0.7), facecolors=[COLOURS.get(s, "#000000") for *_, s in spans], lw=0
        )
        for gone in deletions(spans):
            ax.plot([gone], [y], marker="x", color="#212121", markersize=6)
    _requests(ax, [r for r in records if r.model == model], base=len(lanes))
    _incidents(ax, timeline.incidents_of(model), top=len(lanes))
    ax.set_yticks(range(len(lanes)), [_short(p, model) for p in lanes], fontsize=7)
    ax.set_ylim(-0.6, len(lanes) + 1.1)
    ax.set_ylabel(
        model,
        rotation=0,
        ha="right",
        va="center",
        fontsize=9,
        fontweight="bold",
        color=colour or "#000000",
    )
    ax.tick_params(axis="x", labelsize=8)
    ax.grid(axis="x", alpha=0.3)
    twin: Any = ax.twinx()
    times, gib = timeline.gpu_gib(model)
    twin.step(times, gib, where="post", color="#424242", linewidth=1.0)
    # The memory line peaks just under the top lane, below the band of requests.
    lanes_n = max(len(lanes), 1)
    top = max(max(gib, default=0.0), 1.0) * (lanes_n + 1.7) / (lanes_n + 0.1)
    twin.set_ylim(0, top)
    twin.tick_params(axis="y", labelsize=7)
    twin.set_ylabel("GPU GiB", fontsize=7)


def _pool_row(
    ax: Any, timeline: Timeline, pool: str, members: Sequence[str], colours: Mapping[str, str]
) -> None:
    """The device's memory stacked by member (the simulated GPU's own count), free on top;
    the pool's own count of what is used (it counts a member put to sleep at its whole
    footprint until the engine confirms the sleep); a marker at each swap."""
    times, held, free, counted = timeline.pool_gib(pool, members)
    ax.set_ylabel(
        f"GPUPool\n{pool}\n(GiB)",
        rotation=0,
        ha="right",
        va="center",
        fontsize=9,
        fontweight="bold",
    )
    ax.tick_params(labelsize=7)
    ax.grid(axis="x", alpha=0.3)
    if not times:
        ax.text(0.5, 0.5, "not sampled", ha="center", va="center", transform=ax.transAxes)
        return
    series = [held[m] for m in members] + [free]
    ax.stackplot(
        times,
        series,
        colors=[colours[m] for m in members] + [FREE],
        labels=[*members, "free"],
        step="post",
        alpha=0.85,
    )
    total = max(sum(values[i] for values in held.values()) + free[i] for i in range(len(times)))
    ax.step(times, counted, where="post", color="#212121", lw=1.0, ls="--")
    swaps = timeline.swaps_of(pool)
    _swaps(ax, swaps, top=total)
    ax.set_ylim(0, total * 1.32)
    ax.legend(loc="upper left", fontsize=7, ncol=len(members) + 1, frameon=False)


def _swaps(ax: Any, swaps: Sequence[Swap], *, top: float) -> None:
    # A marker at each member put to sleep, with who made room for whom, on two alternating
    # lines so that two swaps at once stay readable.
    for n, swap in enumerate(swaps):
        y = top * (1.06 if n % 2 == 0 else 1.17)
        ax.plot([swap.t], [top * 1.01], marker="v", color="#212121", markersize=4)
        target = "start" if swap.for_start else swap.making_room_for
        ax.annotate(
            f"{swap.model}→{target}",
            xy=(swap.t, y),
            xytext=(2, 0),
            textcoords="offset points",
            fontsize=6,
            va="center",
        )


def _requests(ax: Any, records: Sequence[Record], *, base: int) -> None:
    # Requests stack in a band above the lanes, cycling over a few rows so bursts stay visible.
    for i, record in enumerate(records):
        y = base + 0.1 + (i % 5) * 0.2
        end = record.answered if record.answered is not None else record.sent
        outcome = "error" if not record.ok else ("held" if record.held >= 0.05 else "ok")
        ax.plot(
            [record.sent, max(end, record.sent + 0.05)], [y, y], color=OUTCOMES[outcome], lw=1.6
        )


def _incidents(ax: Any, incidents: Sequence[Incident], *, top: int) -> None:
    # A red line at each failure and remedy, labelled with what happened and why: the
    # failed band itself may last only the moment before the restart.
    for n, incident in enumerate(incidents):
        ax.axvline(incident.t, color=COLOURS[EngineState.FAILED], lw=1.0, ls="--")
        ax.annotate(
            incident.describe(),
            xy=(incident.t, top + 0.9 - 0.35 * (n % 2)),
            xytext=(4, 0),
            textcoords="offset points",
            fontsize=7,
            color=COLOURS[EngineState.FAILED],
            va="center",
        )


def deletions(spans: Sequence[tuple[float, float, str]]) -> list[float]:
    """When a pod that existed stopped existing: a restart or a scale-down (pure)."""
    return [
        after[0]
        for before, after in itertools.pairwise(spans)
        if before[2] != Shown.ABSENT and after[2] == Shown.ABSENT
    ]


def _short(pod: str, model: str) -> str:
    return "pod " + pod.removeprefix(f"{model}-")
