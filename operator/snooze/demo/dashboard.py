"""The Grafana dashboard's panels, queried from the demo's Prometheus and plotted as a PNG."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from snooze.demo.timeline import COLOURS

BOARD = Path(__file__).resolve().parents[3] / "charts" / "snooze" / "dashboards" / "snooze.json"
# Grafana's classic palette, after the states' own colours (those of timeline.png).
PALETTE = ["#73bf69", "#f2cc0c", "#5794f2", "#ff780a", "#f2495c", "#b877d9", "#8ab8ff"]
NAMED = {**COLOURS, "p50": "#73bf69", "p95": "#f2cc0c", "p99": "#f2495c", "200": "#73bf69"}
UNITS = {"s": "seconds", "reqps": "requests/s", "percentunit": "%", "short": ""}


@dataclass
class Panel:
    title: str
    kind: str  # "stat", "timeseries" or "row"
    grid: dict[str, int]
    unit: str = ""
    stacked: bool = False
    bars: bool = False
    series: list[tuple[str, list[float], list[float]]] = field(default_factory=list)


def _legend(fmt: str, labels: dict[str, str]) -> str:
    if fmt:
        return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt)
    return ",".join(f"{k}={v}" for k, v in labels.items() if k != "__name__") or "value"


def query(
    url: str, *, start: float, end: float, namespace: str, scrape: float, scale: float
) -> list[Panel]:
    """Every panel's targets over [start, end], their variables set as Grafana would."""
    step = max(1.0, (end - start) / 500)
    rate = f"{math.ceil(max(4 * scrape, step + scrape, 15 * scale))}s"
    values = {"$__rate_interval": rate, "$__range": f"{math.ceil(end - start)}s"}
    values |= {"$namespace": namespace, "$model": ".*", "$pool": ".*"}
    panels: list[Panel] = []
    with httpx.Client(base_url=url, timeout=10) as http:
        for spec in json.loads(BOARD.read_text())["panels"]:
            defaults = spec.get("fieldConfig", {}).get("defaults", {})
            custom = defaults.get("custom", {})
            panel = Panel(
                title=spec["title"],
                kind=spec["type"],
                grid=spec["gridPos"],
                unit=defaults.get("unit", ""),
                stacked=custom.get("stacking", {}).get("mode", "none") != "none",
                bars=custom.get("drawStyle") == "bars",
            )
            for target in spec.get("targets", []):
                expr = target["expr"]
                for name, value in values.items():
                    expr = expr.replace(name, value)
                params = {"query": expr, "start": start, "end": end, "step": step}
                body = http.get("/api/v1/query_range", params=params).raise_for_status().json()
                for result in body["data"]["result"]:
                    legend = _legend(target.get("legendFormat", ""), result["metric"])
                    times = [float(t) - start for t, _ in result["values"]]
                    panel.series.append((legend, times, [float(v) for _, v in result["values"]]))
            panels.append(panel)
    return panels


def _number(value: float, unit: str) -> str:
    if unit == "h":  # as Grafana shows hours: in minutes or seconds when under one
        for size, name in ((1.0, "h"), (1 / 60, "min"), (1 / 3600, "s")):
            if abs(value) >= size or name == "s":
                return f"{value / size:.3g} {name}"
    return f"{value:.3g}"


def _last(values: list[float]) -> float:
    return next((v for v in reversed(values) if not math.isnan(v)), math.nan)


def _draw(ax: Any, key: Any, panel: Panel, end: float) -> None:
    ax.set_title(panel.title, fontsize=9, loc="left", fontweight="bold")
    ax.tick_params(labelsize=7)
    if not panel.series:
        ax.text(0.5, 0.5, "No data", ha="center", va="center", transform=ax.transAxes)
        return
    colours = [NAMED.get(s[0], PALETTE[i % len(PALETTE)]) for i, s in enumerate(panel.series)]
    if panel.kind == "stat":
        ax.axis("off")
        if len(panel.series) == 1:
            legend, _, values = panel.series[0]
            text = _number(_last(values), panel.unit)
            ax.text(0.5, 0.55, text, ha="center", va="center", fontsize=24, color="#37872d")
            ax.text(0.5, 0.2, legend, ha="center", va="center", fontsize=8, color="#555555")
            return
        ax.axis("on")
        items = sorted((s[0], _last(s[2])) for s in panel.series)
        ax.barh([n for n, _ in items], [v for _, v in items], color="#73bf69")
        for y, (_, v) in enumerate(items):
            ax.text(v, y, f" {_number(v, panel.unit)}", va="center", fontsize=8)
        ax.invert_yaxis()
        ax.set_xticks([])
        ax.margins(x=0.15)
        return
    if panel.stacked:  # the states in timeline.png's order, awake at the bottom
        order = list(COLOURS)
        panel.series.sort(key=lambda s: order.index(s[0]) if s[0] in order else len(order))
        colours = [NAMED.get(s[0], PALETTE[i % len(PALETTE)]) for i, s in enumerate(panel.series)]
    bottom: dict[float, float] = {}
    width = min((s[1][1] - s[1][0] for s in panel.series if len(s[1]) > 1), default=1.0)
    for (legend, times, values), colour in zip(panel.series, colours, strict=True):
        if panel.unit == "percentunit":
            values = [100 * v for v in values]
        if panel.stacked:
            base = [bottom.get(t, 0.0) for t in times]
            top = [b + (0.0 if math.isnan(v) else v) for b, v in zip(base, values, strict=True)]
            bottom.update(zip(times, top, strict=True))
            if panel.bars:
                height = [t - b for t, b in zip(top, base, strict=True)]
                ax.bar(times, height, bottom=base, width=width, color=colour, label=legend)
            else:
                ax.fill_between(times, base, top, step="post", alpha=0.5, color=colour)
                ax.step(times, top, where="post", color=colour, lw=1, label=legend)
        else:
            ax.plot(times, values, color=colour, lw=1.2, label=legend, marker=".", ms=2)
    ax.set_xlim(0, end)
    ax.set_ylim(bottom=0)
    ax.set_ylabel(UNITS.get(panel.unit, panel.unit), fontsize=7)
    ax.grid(alpha=0.3)
    # Below the plot, as Grafana's list legend; a namespace all the series share is left out.
    handles, labels = ax.get_legend_handles_labels()
    shared = {label.split("/")[0] for label in labels if "/" in label}
    if len(shared) == 1 and all("/" in label for label in labels):
        labels = [label.split("/", 1)[1] for label in labels]
    ncol = 3 if panel.grid["w"] <= 8 else 6
    key.legend(handles, labels, fontsize=7, loc="upper left", ncol=ncol, borderaxespad=0)
    key.get_legend().set_frame_on(False)


def render(panels: list[Panel], path: Path, *, end: float, title: str) -> dict[str, Any]:
    """Draw the panels on Grafana's 24-column grid; write the PNG and per-panel counts beside."""
    import matplotlib

    matplotlib.use("Agg")  # no display: the demo writes a file
    import matplotlib.pyplot as plt

    height = max(p.grid["y"] + p.grid["h"] for p in panels)
    fig = plt.figure(figsize=(16, 0.4 * height + 0.8), facecolor="#f4f5f5")
    grid = fig.add_gridspec(height, 24, hspace=1.5, wspace=3, left=0.05, right=0.98)
    grid.update(top=0.96, bottom=0.02)
    for panel in panels:
        g = panel.grid
        cell = grid[g["y"] : g["y"] + g["h"], g["x"] : g["x"] + g["w"]]
        if panel.kind == "row":
            ax = fig.add_subplot(cell)
            ax.axis("off")
            ax.text(0, 0, panel.title, fontsize=11, fontweight="bold", va="bottom")
        else:
            sub: Any = cell.subgridspec(2, 1, height_ratios=[5, 1], hspace=0.3)
            key = fig.add_subplot(sub[1])
            key.axis("off")
            _draw(fig.add_subplot(sub[0]), key, panel, end)
    fig.suptitle(title, fontsize=11, y=0.995)
    fig.text(0.5, 0.005, "x axis: seconds since the traffic started", ha="center", fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=72)
    plt.close(fig)
    counts = {
        "panels": [
            {
                "title": p.title,
                "type": p.kind,
                "series": len(p.series),
                "points": sum(not math.isnan(v) for _, _, vs in p.series for v in vs),
            }
            for p in panels
            if p.kind != "row"
        ]
    }
    path.with_suffix(".json").write_text(json.dumps(counts, indent=1))
    return counts
