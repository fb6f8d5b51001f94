"""`snooze check` run as a person runs it: a process of its own, its output read whole, its exit
status and its time kept; and its text output read back into (subject, check, level) lines.
Beside it, what the engine tests share: the simulator's release modes and quick timings."""

from __future__ import annotations

import json
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from processes import SNOOZE

SIM = Path(__file__).resolve().parents[2] / "operator" / "snooze" / "sim"
FAST = {
    "sleep_seconds": 0.05,
    "level2_sleep_seconds": 0.05,
    "wake_seconds": 0.05,
    "kv_wake_seconds": 0.02,
    "reload_seconds": 0.05,
    "checksum_seconds_per_gib": 0.001,
}
"""A simulated engine's timings, made quick: what the tests read is not how long they take."""


def release_modes(*sources: str, oldest: tuple[int, int, int]) -> list[str]:
    """Every release where the simulated contract changes something: the release bounds
    written in the simulator's `sources` (sim/*.py), from `oldest`."""
    text = "\n".join((SIM / name).read_text() for name in sources)
    found = {tuple(int(p) for p in match) for match in re.findall(r"\((\d+), (\d+), (\d+)\)", text)}
    return [".".join(map(str, r)) for r in sorted(found | {oldest}) if r >= oldest]


CYCLED = dict.fromkeys(("cycle-sleep", "cycle-wake", "cycle-output", "cycle-weights"), "ok")
"""The lines of a cycle that went as it should."""


LINE = re.compile(r"^  (ok|warning|FAILURE) +([a-z-]+): ")
LEVELS = {"ok": "ok", "warning": "warning", "FAILURE": "failure"}


@dataclass(frozen=True)
class Run:
    code: int
    out: str
    err: str
    seconds: float

    def lines(self) -> dict[tuple[str, str], str]:
        """(subject, check) -> level, from the text output."""
        found: dict[tuple[str, str], str] = {}
        subject = ""
        for line in self.out.splitlines():
            match = LINE.match(line)
            if match:
                found[(subject, match.group(2))] = LEVELS[match.group(1)]
            elif not line.startswith(" ") and not re.match(r"^\d+ ok, ", line):
                subject = line
        return found

    def line(self, check: str) -> str:
        """The one line of `check` (the first subject's)."""
        [found] = [line for line in self.out.splitlines() if re.match(rf"^  \S+ +{check}: ", line)][
            :1
        ]
        return found

    def document(self) -> dict[str, Any]:
        document: dict[str, Any] = json.loads(self.out)
        return document


def check(*args: str, env: dict[str, str] | None = None, timeout: float = 120.0) -> Run:
    started = time.monotonic()
    done = subprocess.run(
        [*SNOOZE, "check", *args], capture_output=True, text=True, timeout=timeout, env=env
    )
    return Run(done.returncode, done.stdout, done.stderr, time.monotonic() - started)
