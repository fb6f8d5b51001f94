"""What happened over time: samples of every pod's state and GPU memory, and the PNG of them."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from snooze.demo.traffic import Record

GIB = 1024**3
# Published routing states plus the two the demo adds: loading (not Ready yet) and absent.
COLOURS = {
    "awake": "#2e7d32",
    "draining": "#f9a825",
    "asleep": "#1565c0",
    "waking": "#8e24aa",
    "failed": "#c62828",
    "loading": "#90a4ae",
    "absent": "#eeeeee",
}
OUTCOMES = {"ok": "#2e7d32", "held": "#ef6c00", "error": "#c62828"}


@dataclass(frozen=True, kw_only=True)
class PodSample:
    model: str
    state: str
    gpu_bytes: int


@dataclass(frozen=True, kw_only=True)
class ModelSample:
    phase: str
    awake: int
    asleep: int
    held: int
    last_wake_time: str | None
    last_wake_seconds: float | None


@dataclass(frozen=True, kw_only=True)
class Incident:
    """Something that went wrong, or the operator's remedy for it, `t` seconds in."""

    t: float
    model: str
    what: str
    """`wake failed`, `sleep failed` or `pod restarted`."""
    reason: str
    """The operator's reason: HybridKVCacheReinit, Timeout, Unreachable..."""

    def describe(self) -> str:
        return f"{self.what} ({self.reason})" if self.reason else self.what


@dataclass(frozen=True, kw_only=True)
class Sample:
    """The cluster at one instant, `t` seconds after the scenario started."""

    t: float
    pods: Mapping[str, PodSample]
    models: Mapping[str, ModelSample]
    incidents: tuple[Incident, ...] = ()
    """Those first seen at this sample."""


def failed(pod: PodSample) -> PodSample:
    return PodSample(model=pod.model, state="failed", gpu_bytes=pod.gpu_bytes)


def with_failed(sample: Sample, pods: set[str]) -> Sample:
    """The sample with these pods drawn as failed (pure)."""
    if not pods:
        return sample
    redrawn = {n: failed(p) if n in pods else p for n, p in sample.pods.items()}
    return Sample(t=sample.t, pods=redrawn, models=sample.models, incidents=sample.incidents)


@dataclass
class Timeline:
    """Samples in time order, and the wake durations seen in the operator's metric."""

    samples: list[Sample] = field(default_factory=list)
    wakes: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    """Per model, (time, seconds) of each wake the operator measured."""
    incidents: list[Incident] = field(default_factory=list)
    """Failures and restarts, in time order."""

    def add(self, sample: Sample) -> None:
        self.samples.append(sample)

    def lanes(self, model: str) -> list[str]:
        """The model's pods in order of first appearance: one lane each in the picture."""
        seen: dict[str, None] = {}
        for sample in self.samples:
            for pod, info in sample.pods.items():
                if info.model == model:
                    seen.setdefault(pod, None)
        return list(seen)

    def spans(self, model: str, pod: str) -> list[tuple[float, float, str]]:
        """(start, end, state) runs of one pod; `absent` where it did not exist (pure)."""
        runs: list[tuple[float, float, str]] = []
        for here, after in zip(self.samples, self.samples[1:], strict=False):
            info = here.pods.get(pod)
            state = info.state if info is not None and info.model == model else "absent"
            if runs and runs[-1][2] == state and runs[-1][1] == here.t:
                runs[-1] = (runs[-1][0], after.t, state)
            else:
                runs.append((here.t, after.t, state))
        return runs

    def states_seen(self, model: str) -> set[str]:
        """Every state any of the model's pods was drawn in."""
        return {p.state for s in self.samples for p in s.pods.values() if p.model == model}

    def incidents_of(self, model: str) -> list[Incident]:
        return [i for i in self.incidents if i.model == model]

    def serving_again(self, model: str, after: float) -> float | None:
        """When the model next had an awake pod after `after`, if it did."""
        for sample in self.samples:
            if sample.t > after and any(
                p.model == model and p.state == "awake" for p in sample.pods.values()
            ):
                return sample.t
        return None

    def gpu_gib(self, model: str) -> tuple[list[float], list[float]]:
        times = [s.t for s in self.samples]
        values = [
            sum(p.gpu_bytes for p in s.pods.values() if p.model == model) / GIB
            for s in self.samples
        ]
        return times, values


def render_png(
    timeline: Timeline,
    records: Sequence[Record],
    models: Sequence[str],
    path: Path,
    *,
    title: str,
) -> Path:
    """Draw one row per model: pod state bands, requests from sent to answered, GPU memory."""
    import matplotlib

    matplotlib.use("Agg")  # no display: the demo writes a file
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    end = timeline.samples[-1].t if timeline.samples else 1.0
    fig, axes = plt.subplots(
        len(models), 1, figsize=(12, 1.7 * len(models) + 0.9), sharex=True, squeeze=False
    )
    for ax, model in zip((row[0] for row in axes), models, strict=True):
        lanes = timeline.lanes(model)
        for y, pod in enumerate(lanes):
            bars = [(start, stop - start) for start, stop, _ in timeline.spans(model, pod)]
            colours = [COLOURS.get(s, "#000000") for _, _, s in timeline.spans(model, pod)]
            ax.broken_barh(bars, (y - 0.35, 0.7), facecolors=colours, linewidth=0)
            for gone in _deletions(timeline.spans(model, pod)):
                ax.plot([gone], [y], marker="x", color="#212121", markersize=6)
        _requests(ax, [r for r in records if r.model == model], base=len(lanes))
        _incidents(ax, timeline.incidents_of(model), top=len(lanes))
        ax.set_yticks(range(len(lanes)), [_short(p, model) for p in lanes], fontsize=7)
        ax.set_ylim(-0.6, len(lanes) + 1.1)
        ax.set_ylabel(model, rotation=0, ha="right", va="center", fontsize=9, fontweight="bold")
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
    last = axes[-1][0]
    last.set_xlim(0, end)
    last.set_xlabel("seconds since the scenario started")
    handles: list[Any] = [Patch(color=c, label=s) for s, c in COLOURS.items()]
    handles += [Patch(color=c, label=f"request: {o}") for o, c in OUTCOMES.items()]
    handles.append(Line2D([], [], color="#424242", lw=1, label="GPU memory (GiB, right)"))
    handles.append(Line2D([], [], color="#212121", marker="x", lw=0, label="pod deleted"))
    fig.suptitle(title, fontsize=10, y=0.995)
    fig.legend(
        handles=handles,
        loc="upper center",
        ncol=6,
        fontsize=7,
        frameon=False,
        bbox_to_anchor=(0.5, 0.97),
    )
    fig.tight_layout(rect=(0, 0, 1, 0.92))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


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
        ax.axvline(incident.t, color=COLOURS["failed"], lw=1.0, ls="--")
        ax.annotate(
            incident.describe(),
            xy=(incident.t, top + 0.9 - 0.35 * (n % 2)),
            xytext=(4, 0),
            textcoords="offset points",
            fontsize=7,
            color=COLOURS["failed"],
            va="center",
        )


def _deletions(spans: Sequence[tuple[float, float, str]]) -> list[float]:
    """When a pod that existed stopped existing: a restart or a scale-down (pure)."""
    return [
        after[0]
        for before, after in itertools.pairwise(spans)
        if before[2] != "absent" and after[2] == "absent"
    ]


def _short(pod: str, model: str) -> str:
    return "pod " + pod.removeprefix(f"{model}-")
