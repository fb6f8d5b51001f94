"""Request traces: the CSV format `snooze whatif` reads (a header, then `timestamp`, `model` and
optionally `output_tokens` per request, plain or gzip-compressed), read line by line into
compact per-model columns, with errors that name the line and what to write instead."""

from __future__ import annotations

import csv
import gzip
import io
import math
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

REQUIRED = ("timestamp", "model")
OPTIONAL = ("output_tokens",)
LINE_LIMIT = 4096
"""Characters a line may hold: a timestamp, a model name and a count take far fewer, and a
bound keeps one endless line (or one huge quoted field) from filling the memory."""
MODEL_LIMIT = 253
"""Characters of a model name (a Kubernetes object name's limit)."""
MODELS_LIMIT = 10_000
"""Distinct models a trace may name: each is simulated on its own, and a bound keeps the
memory a trace takes proportional to its requests."""
TOKENS_LIMIT = 10_000_000
NO_TOKENS = -1
"""The output_tokens column's value for a request whose line gives none."""
EARLIEST = datetime(1900, 1, 1, tzinfo=UTC).timestamp()
LATEST = datetime(9000, 1, 1, tzinfo=UTC).timestamp()
SINCE_1970_FROM = datetime(2000, 1, 1, tzinfo=UTC).timestamp()
"""Times from here on are taken as dates when printed; earlier ones as seconds from a start."""
"""Times whatif takes: pre-wake and schedules read them as dates, and the longest lead or
idle period a spec may give (292 years) keeps clear of the calendar's end (year 9999)."""
GZIP_MAGIC = b"\x1f\x8b"


class TraceError(ValueError):
    """A trace that cannot be read; the message names the file, the line and the fix."""


@dataclass(frozen=True, kw_only=True)
class Request:
    at: float
    """Arrival, in seconds (since the epoch when the trace gave ISO 8601 times)."""
    model: str
    output_tokens: int | None = None


@dataclass(kw_only=True)
class ModelRequests:
    """One model's requests as two columns, in order of arrival: 12 bytes a request."""

    name: str
    at: array[float] = field(default_factory=lambda: array("d"))
    tokens: array[int] = field(default_factory=lambda: array("i"))
    """Output tokens, or NO_TOKENS."""

    def __len__(self) -> int:
        return len(self.at)

    def sort(self) -> None:
        """Put the requests in order of arrival (stable: equal times keep the file's order)."""
        if all(a <= b for a, b in zip(self.at, self.at[1:], strict=False)):
            return
        order = sorted(range(len(self.at)), key=self.at.__getitem__)
        self.at = array("d", (self.at[i] for i in order))
        self.tokens = array("l", (self.tokens[i] for i in order))

    def requests(self) -> Iterator[Request]:
        for at, tokens in zip(self.at, self.tokens, strict=True):
            yield Request(at=at, model=self.name, output_tokens=None if tokens < 0 else tokens)


@dataclass(kw_only=True)
class Trace:
    """Every model's requests, each model's in order of arrival."""

    models: dict[str, ModelRequests]
    """By name, in order of their first request in the file."""

    @property
    def first(self) -> float:
        return min(m.at[0] for m in self.models.values())

    @property
    def last(self) -> float:
        return max(m.at[-1] for m in self.models.values())

    def __len__(self) -> int:
        return sum(len(m) for m in self.models.values())

    @classmethod
    def of(cls, requests: Iterable[Request]) -> Trace:
        """A trace of these requests (for tests and callers that hold requests already)."""
        models: dict[str, ModelRequests] = {}
        for r in requests:
            column = models.get(r.model) or models.setdefault(r.model, ModelRequests(name=r.model))
            column.at.append(r.at)
            column.tokens.append(NO_TOKENS if r.output_tokens is None else r.output_tokens)
        if not models:
            raise TraceError("the trace has no request")
        for column in models.values():
            column.sort()
        return cls(models=models)

    def requests(self) -> list[Request]:
        """Every request, in order of arrival (for small traces: a Python object each)."""
        out = [r for m in self.models.values() for r in m.requests()]
        out.sort(key=lambda r: r.at)
        return out


def parse_time(text: str) -> float:
    """Seconds (a number), or an ISO 8601 time (naive times are UTC), from 1900 to 9000."""
    try:
        value = float(text)
    except ValueError:
        try:
            moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
            if moment.tzinfo is None:
                moment = moment.replace(tzinfo=UTC)
            value = moment.timestamp()
        except (ValueError, OverflowError):
            raise ValueError(
                f"{_short(text)!r} is neither seconds nor an ISO 8601 time such as "
                "2026-05-04T09:30:00Z"
            ) from None
    if not math.isfinite(value):
        raise ValueError(f"{_short(text)!r} is not a finite number of seconds")
    if not EARLIEST <= value <= LATEST:
        raise ValueError(
            f"{_short(text)!r} is outside the years 1900 to 9000 that whatif simulates: give "
            "seconds since 1970-01-01 (or since the trace's start) or an ISO 8601 time"
        )
    return value


def format_time(value: float) -> str:
    """A trace's time as the trace gives it, in seconds; with its date too where the trace
    counts from 1970 (a trace may count from its own start instead)."""
    seconds = f"{value:.0f}" if value == int(value) else f"{value:.1f}"
    if value < SINCE_1970_FROM:
        return seconds
    moment = datetime.fromtimestamp(value, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"{seconds} ({moment})"


def _short(text: str) -> str:
    return text if len(text) <= 40 else f"{text[:37]}..."


def read(path: Path) -> Trace:
    """The requests of a trace file (CSV, or CSV compressed with gzip); `#` lines are
    comments. Read a line at a time: what it holds is about 12 bytes a request."""
    try:
        with path.open("rb") as raw:
            compressed = raw.read(2) == GZIP_MAGIC
    except OSError as exc:
        raise TraceError(f"{path}: cannot read the trace: {exc.strerror or exc}") from None
    try:
        with (
            gzip.open(path, "rb") if compressed else path.open("rb") as binary,
            io.TextIOWrapper(binary, encoding="utf-8-sig", newline="") as text,
        ):
            return parse(_lines(text), source=str(path))
    except UnicodeDecodeError:
        raise TraceError(f"{path}: not a UTF-8 text file; a trace is CSV") from None
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        what = "a gzip file cut short or damaged" if compressed else "unreadable"
        raise TraceError(f"{path}: {what}: {exc}") from None


def _lines(text: io.TextIOWrapper) -> Iterator[str]:
    while True:
        line = text.readline(LINE_LIMIT + 2)
        if not line:
            return
        yield line


def parse(lines: Iterable[str], *, source: str = "trace") -> Trace:
    """A trace from its lines (with or without their line ends)."""
    where: dict[str, int] | None = None
    models: dict[str, ModelRequests] = {}
    line_no = 0
    for line_no, line in enumerate(lines, 1):
        content = line.rstrip("\r\n")
        if len(content) > LINE_LIMIT:
            raise TraceError(
                f"{source}, line {line_no}: longer than {LINE_LIMIT} characters: a trace's line "
                "holds a timestamp, a model and a token count"
            )
        if not content.strip() or content.startswith("#"):
            continue
        try:
            row = _split(content)
            if where is None:
                where = _header(row)
                continue
            _add(models, row, where)
        except ValueError as exc:
            raise TraceError(f"{source}, line {line_no}: {exc}") from None
    if where is None:
        raise TraceError(
            f"{source}: empty: write a header `timestamp,model` and one request a line"
        )
    if not models:
        raise TraceError(f"{source}: a header but no request")
    for column in models.values():
        column.sort()
    return Trace(models=models)


def _split(content: str) -> list[str]:
    if '"' not in content:
        return content.split(",")
    try:
        return next(csv.reader([content], strict=True))
    except csv.Error as exc:
        raise ValueError(
            f"a quoted field that does not end on its line ({exc}): a trace has one request "
            "a line, and a quote inside a field is written twice"
        ) from None


def _header(row: list[str]) -> dict[str, int]:
    header = [h.strip() for h in row]
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise ValueError(
            f"the header {_short(','.join(header))!r} lacks {', '.join(missing)}: a trace's "
            "header names timestamp and model (and optionally output_tokens)"
        )
    return {name: header.index(name) for name in (*REQUIRED, *OPTIONAL) if name in header}


def _add(models: dict[str, ModelRequests], row: list[str], where: dict[str, int]) -> None:
    if len(row) <= max(where.values()):
        raise ValueError(f"{len(row)} columns where the header has {max(where.values()) + 1}")
    model = row[where["model"]].strip()
    if not model:
        raise ValueError("the model is empty")
    if len(model) > MODEL_LIMIT:
        raise ValueError(f"the model's name is longer than {MODEL_LIMIT} characters")
    tokens = NO_TOKENS
    if "output_tokens" in where:
        raw = row[where["output_tokens"]].strip()
        if raw:
            if not (raw.isdigit() and raw.isascii()) or int(raw) > TOKENS_LIMIT:
                raise ValueError(
                    f"output_tokens {_short(raw)!r} is not a whole number of tokens up to "
                    f"{TOKENS_LIMIT:,}"
                )
            tokens = int(raw)
    at = parse_time(row[where["timestamp"]].strip())
    column = models.get(model)
    if column is None:
        if len(models) >= MODELS_LIMIT:
            raise ValueError(
                f"more than {MODELS_LIMIT:,} models: split the trace and compare a part at a time"
            )
        column = models[model] = ModelRequests(name=model)
    column.at.append(at)
    column.tokens.append(tokens)


def write(requests: Iterable[Request], *, header_comment: str = "") -> str:
    """A trace file's text: the comment lines (if any), the header, one request a line."""
    out = io.StringIO()
    for line in header_comment.splitlines():
        out.write(f"# {line}\n")
    # Quoted where a name needs it (a comma or a quote in a model's name is data).
    rows = csv.writer(out, lineterminator="\n")
    rows.writerow(("timestamp", "model", "output_tokens"))
    for r in requests:
        tokens = "" if r.output_tokens is None else str(r.output_tokens)
        rows.writerow((f"{r.at:.3f}", r.model, tokens))
    return out.getvalue()
