"""The live view: a table redrawn in place on a terminal, change lines in a plain log."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import TextIO

from snooze.demo.timeline import GIB, Incident, ModelSample, Sample, Swap
from snooze.demo.traffic import Record

TABLE_EVERY = 10.0  # seconds between compact tables in a plain log
NOTES = 3  # the scenario's latest actions, shown under the table on a TTY


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


def pool_lines(
    sample: Sample, pools: Mapping[str, Sequence[str]], swaps: Mapping[str, Swap] | None = None
) -> list[str]:
    """One line per GPU pool: its memory, who is awake, who waits, the last swap (pure)."""
    out = []
    for name, members in pools.items():
        pool = sample.pools.get(name)
        if pool is None:
            continue
        used = (pool.memory_bytes - pool.free_bytes) / GIB
        awake = [m for m in members if (s := sample.models.get(m)) is not None and s.awake]
        line = (
            f"GPUPool {name}: {used:.0f} of {pool.memory_bytes / GIB:.0f} GiB used, awake: "
            f"{', '.join(awake) or '-'}; waiting for room: {', '.join(pool.waiting) or '-'}"
        )
        swap = (swaps or {}).get(name)
        if swap is not None:
            line += f"; {swap.t:.1f}s {swap.model} slept for {swap.making_room_for}"
        out.append(line)
    return out


def _note(m: ModelSample | None, incident: Incident | None) -> str:
    if incident is not None:
        return f"{incident.t:.1f}s {incident.describe()}"
    if m is not None and m.waiting_for_room:
        return m.waiting_for_room
    return _wake(m)


def _phase(m: ModelSample | None) -> str:
    return "-" if m is None else m.phase or "-"


def _n(m: ModelSample | None, what: str) -> str:
    return "-" if m is None else str(getattr(m, what))


def _wake(m: ModelSample | None) -> str:
    if m is None or m.last_wake_seconds is None:
        return "-"
    at = m.last_wake_time.strftime("%H:%M:%S") if m.last_wake_time is not None else ""
    return f"{at} in {m.last_wake_seconds:.2f}s"


class LiveView:
    """Shows samples as they come: ANSI redraws on a TTY, one line per change otherwise."""

    def __init__(
        self,
        models: Sequence[str],
        out: TextIO | None = None,
        pools: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        self.models = list(models)
        self.pools = dict(pools or {})
        self.out = out or sys.stdout
        self.tty = self.out.isatty()
        self._drawn = 0
        self._last: dict[str, tuple[str, int, int, int, str | None]] = {}
        self._table_at = 0.0
        self._incidents: dict[str, Incident] = {}
        self._swaps: dict[str, Swap] = {}
        self._notes: list[str] = []

    def show(self, sample: Sample, records: Sequence[Record]) -> None:
        for incident in sample.incidents:
            self._incidents[incident.model] = incident
            if not self.tty:
                print(f"{incident.t:6.1f}s {incident.model}: {incident.describe()}", file=self.out)
        for swap in sample.swaps:
            self._swaps[swap.pool] = swap
            if not self.tty:
                print(f"{swap.t:6.1f}s {swap.describe()}", file=self.out)
        if self.tty:
            lines = rows(sample, self.models, records, self._incidents)
            self._redraw(lines + pool_lines(sample, self.pools, self._swaps) + self._notes)
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
            key = (m.phase, m.awake, m.asleep, m.held, m.waiting_for_room)
            if self._last.get(model) != key:
                self._last[model] = key
                print(
                    f"{sample.t:6.1f}s {model}: {m.phase or '-'}, awake {m.awake}, "
                    f"asleep {m.asleep}, held {m.held}"
                    + (f", last wake {m.last_wake_seconds:.2f}s" if m.last_wake_seconds else "")
                    + (f"; {m.waiting_for_room}" if m.waiting_for_room else ""),
                    file=self.out,
                )
        if sample.t - self._table_at >= TABLE_EVERY:
            self._table_at = sample.t
            lines = rows(sample, self.models, records, self._incidents)
            for line in lines + pool_lines(sample, self.pools, self._swaps):
                print("  | " + line, file=self.out)
        self.out.flush()

    def say(self, line: str) -> None:
        """Something the scenario did: a line in a plain log, under the table on a TTY."""
        if self.tty:
            self._notes = [*self._notes, line][-NOTES:]
        else:
            print(line, file=self.out, flush=True)

    def release(self) -> None:
        """Leave the last table on screen; what follows prints below it."""
        self._drawn = 0
