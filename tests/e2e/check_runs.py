"""`snooze check` run as a person runs it: a process of its own, its output read whole, its exit
status and its time kept; and its text output read back into (subject, check, level) lines."""

from __future__ import annotations

import json
import re
import subprocess
import time
from dataclasses import dataclass
from typing import Any

from processes import SNOOZE

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
