"""What `snooze check` found, as people read it (one line per check) and as scripts read it
(`--output json`, a shape that only grows): pure."""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

FORMAT_VERSION = 1
"""The version of the JSON shape (docs/check.md): raised only if a field changes meaning or
goes away; new fields and new checks come without it."""


CHECKS = frozenset(
    {
        # The cluster's.
        "api", "crds", "operator", "leader", "permissions", "models", "model", "pods", "engines",
        "pool", "members-node", "members-claim",
        # An engine's.
        "engine", "dev-mode", "sleep-mode", "serve-args", "known-bugs", "weight-checker",
        "metrics", "cycle-sleep", "cycle-wake", "cycle-output", "cycle-weights",
        # An SGLang server's own.
        "api-keys", "memory-saver", "cpu-backup",
    }
)  # fmt: skip
"""Every check's name: docs/check.md describes each (a test keeps the two alike), and scripts
read them from --output json; a name is never reused for another meaning."""


class Level(enum.StrEnum):
    OK = "ok"
    WARNING = "warning"
    """Snooze works, with less than it could do, or the check could not tell."""
    FAILURE = "failure"
    """Snooze will not work here until this is fixed."""


class Kind(enum.StrEnum):
    """What a check is about; the name beside it is a user's (a model's, a URL), never a word
    of ours, so the two are kept apart."""

    ENGINE = "Engine"
    CLUSTER = "Cluster"
    OPERATOR = "Operator"
    MODEL = "InferenceModel"
    POOL = "GPUPool"


@dataclass(frozen=True, kw_only=True)
class Subject:
    kind: Kind
    name: str = ""
    namespace: str = ""

    def shown(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.kind.value} {where}" if where else self.kind.value

    def as_json(self) -> dict[str, str]:
        found = {"kind": self.kind.value}
        if self.namespace:
            found["namespace"] = self.namespace
        if self.name:
            found["name"] = self.name
        return found


CLUSTER = Subject(kind=Kind.CLUSTER)


@dataclass(frozen=True, kw_only=True)
class Result:
    """One check's outcome."""

    subject: Subject
    check: str
    """Its name, stable across releases (docs/check.md lists them): `dev-mode`, `crds`..."""
    level: Level
    message: str
    """What was found, in a sentence."""
    fix: str = ""
    """What to do, for a warning or a failure."""
    data: Mapping[str, Any] = field(default_factory=dict)
    """Figures a script may want (a cycle's timings, an engine's release), JSON-ready."""

    def __post_init__(self) -> None:
        if self.check not in CHECKS:
            raise ValueError(f"{self.check!r} is not a check's name (report.CHECKS)")


def ok(subject: Subject, check: str, message: str, **data: Any) -> Result:
    return Result(subject=subject, check=check, level=Level.OK, message=message, data=data)


def warning(subject: Subject, check: str, message: str, fix: str, **data: Any) -> Result:
    return Result(
        subject=subject, check=check, level=Level.WARNING, message=message, fix=fix, data=data
    )


def failure(subject: Subject, check: str, message: str, fix: str, **data: Any) -> Result:
    return Result(
        subject=subject, check=check, level=Level.FAILURE, message=message, fix=fix, data=data
    )


def exit_code(results: Iterable[Result]) -> int:
    """0 when nothing failed (warnings included), else 1; 2 is for bad flags."""
    return 1 if any(r.level is Level.FAILURE for r in results) else 0


def counts(results: Iterable[Result]) -> dict[str, int]:
    found = dict.fromkeys((level.value for level in Level), 0)
    for result in results:
        found[result.level.value] += 1
    return found


def as_json(results: Sequence[Result]) -> dict[str, Any]:
    """The document `--output json` prints (docs/check.md describes each field)."""
    return {
        "version": FORMAT_VERSION,
        "passed": exit_code(results) == 0,
        "counts": counts(results),
        "checks": [
            {
                "subject": r.subject.as_json(),
                "check": r.check,
                "level": r.level.value,
                "message": r.message,
                "fix": r.fix,
                "data": dict(r.data),
            }
            for r in results
        ],
    }


def json_text(results: Sequence[Result]) -> str:
    return json.dumps(as_json(results), indent=2) + "\n"


_MARK = {Level.OK: "ok", Level.WARNING: "warning", Level.FAILURE: "FAILURE"}
_WIDTH = max(len(mark) for mark in _MARK.values())


def text(results: Sequence[Result]) -> str:
    """One line per check under a line per subject, then the counts: what a person reads."""
    lines: list[str] = []
    current: Subject | None = None
    for result in results:
        if result.subject != current:
            current = result.subject
            lines.append(current.shown())
        line = f"  {_MARK[result.level]:<{_WIDTH}}  {result.check}: {result.message}"
        if result.fix:
            line += f" Fix: {result.fix}"
        lines.append(_one_line(line))
    found = counts(results)
    noun = {"ok": "ok", "warning": "warning", "failure": "failure"}
    said = ", ".join(
        f"{n} {noun[level]}{'s' if n != 1 and level != 'ok' else ''}" for level, n in found.items()
    )
    lines.append(said)
    return "\n".join(lines) + "\n"


def _one_line(line: str) -> str:
    # What an engine or the API said may hold newlines, or a terminal's escape sequences: a
    # check's line stays one line, and shows them as spaces.
    return "".join(c if c.isprintable() else " " for c in line)
