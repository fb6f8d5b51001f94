"""The live view: a table redrawn in place on a terminal, change lines in a plain log."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import TextIO

from snooze.demo.timeline import Incident, ModelSample, Sample
from snooze.demo.traffic import Record

TABLE_EVERY = 10.0  # seconds between compact tables in a plain log


def rows(
    sample: Sample,
    models: Sequence[str],
    records: Sequence[Record],
    incidents: Mapping[str, Incident] | None = None,
) -> list[str]:
    """The table's lines for one instant, with each model's latest incident (pure)."""
    incidents = incidents or {}
    out = [
        f"{'t':>6}  {'model':<17} {'phase':<13} {'awake':>5} {'asleep':>6} {'held':>4} "
        f"{'done':>5} {'err':>3}  last wake / incident"
    ]
    for model in models:
        m = sample.models.get(model)
        done = sum(1 for r in records if r.model == model and r.answered is not None)
        errors = sum(1 for r in records if r.model == model and r.answered is not None and not r.ok)
        out.append(
            f"{sample.t:>5.1f}s  {model:<17} {_phase(m):<13} {_n(m, 'awake'):>5} "
            f"{_n(m, 'asleep'):>6} {_n(m, 'held'):>4} {done:>5} {errors:>3}  "
            f"{_note(m, incidents.get(model))}"
        )
    return out


def _note(m: ModelSample | None, incident: Incident | None) -> str:
    if incident is not None:
        return f"{incident.t:.1f}s {incident.describe()}"
    return _wake(m)


def _phase(m: ModelSample | None) -> str:
    return "-" if m is None else m.phase or "-"


def _n(m: ModelSample | None, what: str) -> str:
    return "-" if m is None else str(getattr(m, what))


def _wake(m: ModelSample | None) -> str:
    if m is None or m.last_wake_seconds is None:
        return "-"
    at = (m.last_wake_time or "")[11:19]
    return f"{at} in {m.last_wake_seconds:.2f}s"


class LiveView:
    """Shows samples as they come: ANSI redraws on a TTY, one line per change otherwise."""

    def __init__(self, models: Sequence[str], out: TextIO | None = None) -> None:
        self.models = list(models)
        self.out = out or sys.stdout
        self.tty = self.out.isatty()
        self._drawn = 0
        self._last: dict[str, tuple[str, int, int, int]] = {}
        self._table_at = 0.0
        self._incidents: dict[str, Incident] = {}

    def show(self, sample: Sample, records: Sequence[Record]) -> None:
        for incident in sample.incidents:
            self._incidents[incident.model] = incident
            if not self.tty:
                print(f"{incident.t:6.1f}s {incident.model}: {incident.describe()}", file=self.out)
        if self.tty:
            self._redraw(rows(sample, self.models, records, self._incidents))
        else:
            self._log(sample, records)

    def _redraw(self, lines: list[str]) -> None:
        # Move up over the previous table and overwrite it, line by line, clearing each.
        prefix = f"\x1b[{self._drawn}F" if self._drawn else ""
        self.out.write(prefix + "".join(f"\x1b[2K{line}\n" for line in lines))
        self.out.flush()
        self._drawn = len(lines)

    def _log(self, sample: Sample, records: Sequence[Record]) -> None:
        for model in self.models:
            m = sample.models.get(model)
            if m is None:
                continue
            key = (m.phase, m.awake, m.asleep, m.held)
            if self._last.get(model) != key:
                self._last[model] = key
                print(
                    f"{sample.t:6.1f}s {model}: {m.phase or '-'}, awake {m.awake}, "
                    f"asleep {m.asleep}, held {m.held}"
                    + (f", last wake {m.last_wake_seconds:.2f}s" if m.last_wake_seconds else ""),
                    file=self.out,
                )
        if sample.t - self._table_at >= TABLE_EVERY:
            self._table_at = sample.t
            for line in rows(sample, self.models, records, self._incidents):
                print("  | " + line, file=self.out)
        self.out.flush()

    def release(self) -> None:
        """Leave the last table on screen; what follows prints below it."""
        self._drawn = 0
