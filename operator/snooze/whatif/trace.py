"""Request traces: the CSV format `snooze whatif` reads (a header, then `timestamp`, `model` and
optionally `output_tokens` per request), parsed with errors that name the line."""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

REQUIRED = ("timestamp", "model")
OPTIONAL = ("output_tokens",)


class TraceError(ValueError):
    """A trace that cannot be read; the message names the file, the line and the fix."""


@dataclass(frozen=True, kw_only=True)
class Request:
    at: float
    """Arrival, in seconds (since the epoch when the trace gave ISO 8601 times)."""
    model: str
    output_tokens: int | None = None


def parse_time(text: str) -> float:
    """Seconds (a number), or an ISO 8601 time (naive times are UTC)."""
    try:
        value = float(text)
    except ValueError:
        try:
            moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(
                f"{text!r} is neither seconds nor an ISO 8601 time such as 2026-05-04T09:30:00Z"
            ) from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return moment.timestamp()
    if not math.isfinite(value):
        raise ValueError(f"{text!r} is not a finite number of seconds")
    return value


def read(path: Path) -> list[Request]:
    """The requests of a trace file, sorted by arrival; `#` lines are comments."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TraceError(f"{path}: cannot read the trace: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise TraceError(f"{path}: not a UTF-8 text file; a trace is CSV") from None
    return parse(text.splitlines(), source=str(path))


def parse(lines: Iterable[str], *, source: str = "trace") -> list[Request]:
    numbered = [
        (n, line) for n, line in enumerate(lines, 1) if line.strip() and not line.startswith("#")
    ]
    if not numbered:
        raise TraceError(
            f"{source}: empty: write a header `timestamp,model` and one request a line"
        )
    rows = csv.reader(line for _, line in numbered)
    header = [h.strip() for h in next(rows)]
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise TraceError(
            f"{source}, line {numbered[0][0]}: the header {','.join(header)!r} lacks "
            f"{', '.join(missing)}: a trace's header names timestamp and model (and optionally "
            "output_tokens)"
        )
    where = {name: header.index(name) for name in (*REQUIRED, *OPTIONAL) if name in header}
    requests = []
    for (line_no, _), row in zip(numbered[1:], rows, strict=True):
        try:
            requests.append(_request(row, where))
        except (ValueError, IndexError) as exc:
            raise TraceError(f"{source}, line {line_no}: {exc}") from None
    if not requests:
        raise TraceError(f"{source}: a header but no request")
    requests.sort(key=lambda r: r.at)
    return requests


def _request(row: list[str], where: dict[str, int]) -> Request:
    if len(row) < len(where):
        raise ValueError(f"{len(row)} columns where the header has at least {len(where)}")
    model = row[where["model"]].strip()
    if not model:
        raise ValueError("the model is empty")
    tokens = None
    if "output_tokens" in where and row[where["output_tokens"]].strip():
        raw = row[where["output_tokens"]].strip()
        if not raw.isdigit():
            raise ValueError(f"output_tokens {raw!r} is not a whole number of tokens")
        tokens = int(raw)
    return Request(
        at=parse_time(row[where["timestamp"]].strip()), model=model, output_tokens=tokens
    )


def write(requests: Iterable[Request], *, header_comment: str = "") -> str:
    """A trace file's text: the comment lines (if any), the header, one request a line."""
    lines = [f"# {line}" for line in header_comment.splitlines()]
    lines.append("timestamp,model,output_tokens")
    for r in requests:
        tokens = "" if r.output_tokens is None else str(r.output_tokens)
        lines.append(f"{r.at:.3f},{r.model},{tokens}")
    return "\n".join(lines) + "\n"
