"""Prometheus text from a peer the operator does not trust (an engine, a gateway replica), read a
chunk at a time: only the lines of the wanted families are parsed, every line and the number of
series are bounded, and a series sent twice is refused, so that neither the operator's memory
nor its CPU grows with what the peer chooses to send."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping

# Far above any line an engine writes (vLLM's longest, vllm:cache_config_info with its 37
# labels, is about 2 kB), far below what would cost memory. A longer line of a family that is
# not read is skipped unread; one of a family that is read makes the page unreadable.
LINE_LIMIT = 64 * 1024
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')

# Past 2**53 a float no longer counts by ones: no counter of requests or seconds gets there.
COUNTER_LIMIT = float(2**53)

Labels = Mapping[str, str]
OnSample = Callable[[str, Labels, float], None]


def parse_labels(text: str) -> dict[str, str]:
    """The labels between a sample's braces, values kept as sent (escapes and all); ValueError
    if they are not `name="value"` pairs, or name one label twice."""
    labels: dict[str, str] = {}
    text, at = text.rstrip(), 0
    while at < len(text):
        match = _LABEL.match(text, at)
        if match is None:
            raise ValueError(f"malformed labels: {text[:80]!r}")
        name, value = match.group(1), match.group(2)
        if name in labels:
            raise ValueError(f"the label {name} twice in one sample: {text[:80]!r}")
        labels[name] = value
        at = match.end()
    return labels


def shown(value: float) -> str:
    """A sample's value as the exposition format writes it (+Inf, -Inf, NaN, 3.5)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return f"{value:g}"


def checked_count(name: str, value: float, limit: float, *, summed: bool = False) -> float:
    """`value` if it can be a count of `name` (finite, from 0 to `limit`); else ValueError
    saying what it is (`summed`: the sum of its series is)."""
    if math.isfinite(value) and 0 <= value <= limit:
        return value
    what = ": its series add up to" if summed else " is"
    raise ValueError(f"{name}{what} {shown(value)}, not a count from 0 to {limit:,.0f}")


class Page:
    """One page of Prometheus text, fed in chunks; each sample of a wanted family goes to
    `on_sample(name, labels, value)` as soon as its line is whole (values unchecked: NaN and
    infinities included, for the caller to judge). Raises ValueError for a malformed line of
    a wanted family, one over LINE_LIMIT, a series sent twice, or more than `series_limit`
    series of the wanted families; lines of other families are not parsed at all.

    Memory: one partial line (at most LINE_LIMIT) and one number per series kept.
    """

    def __init__(self, wanted: Iterable[str], on_sample: OnSample, *, series_limit: int) -> None:
        self._wanted = frozenset(wanted)
        self._prefixes = tuple(sorted({name.encode() for name in self._wanted}))
        self._on_sample = on_sample
        self._series_limit = series_limit
        self._seen: set[int] = set()
        self._partial = b""
        self._skipping = False
        """Within a line over LINE_LIMIT of a family not read: dropped up to its newline."""

    def feed(self, chunk: bytes) -> None:
        data = self._partial + chunk if self._partial else chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        if self._skipping:
            if not lines:
                self._partial = b""
                return
            lines[0] = b""  # the end of the skipped line
            self._skipping = False
        for line in lines:
            if line.startswith(self._prefixes):
                self._line(line)
        if len(self._partial) > LINE_LIMIT:
            if self._partial.startswith(self._prefixes):
                raise ValueError(f"a line longer than {LINE_LIMIT // 1024} KiB")
            self._partial, self._skipping = b"", True

    def close(self) -> None:
        """The page ended: its last line needs no newline."""
        if self._partial and not self._skipping and self._partial.startswith(self._prefixes):
            self._line(self._partial)
        self._partial = b""

    def _line(self, raw: bytes) -> None:
        if len(raw) > LINE_LIMIT:
            raise ValueError(f"a line longer than {LINE_LIMIT // 1024} KiB")
        try:
            line = raw.decode()
        except UnicodeDecodeError:
            raise ValueError(f"a line that is not UTF-8: {raw[:80]!r}") from None
        brace = line.find("{")
        space = line.find(" ")
        if brace != -1 and (space == -1 or brace < space):
            name, close = line[:brace], line.rfind("}")
            if close < brace:
                raise ValueError(f"unclosed labels: {line[:80]!r}")
            text, rest = line[brace + 1 : close], line[close + 1 :]
        else:
            if space == -1:
                raise ValueError(f"no value: {line[:80]!r}")
            name, text, rest = line[:space], "", line[space:]
        if name not in self._wanted:
            return  # a longer name that starts like a wanted one
        labels = parse_labels(text)
        words = rest.split()
        if not words:
            raise ValueError(f"no value: {line[:80]!r}")
        try:
            value = float(words[0])
        except ValueError:
            raise ValueError(f"not a number: {line[:80]!r}") from None
        # Python's hash of strings is salted per process: a peer cannot craft a collision.
        series = hash((name, frozenset(labels.items())))
        if series in self._seen:
            raise ValueError(f"a series sent twice: {line[:80]!r}")
        if len(self._seen) >= self._series_limit:
            raise ValueError(
                f"more than {self._series_limit} series of {', '.join(sorted(self._wanted))}"
            )
        self._seen.add(series)
        self._on_sample(name, labels, value)


def samples(
    text: str, wanted: Iterable[str], *, series_limit: int
) -> list[tuple[str, Labels, float]]:
    """Pure: the (name, labels, value) of each sample of the `wanted` families in a whole page;
    ValueError as Page says."""
    found: list[tuple[str, Labels, float]] = []
    page = Page(wanted, lambda *sample: found.append(sample), series_limit=series_limit)
    page.feed(text.encode())
    page.close()
    return found
