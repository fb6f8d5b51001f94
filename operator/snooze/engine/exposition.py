"""Prometheus text from a peer the operator does not trust (an engine, a gateway replica), read a
chunk at a time: only the lines of the wanted families are parsed, every line and the number of
series are bounded, and a series sent twice is refused, so that neither the operator's memory
nor its CPU grows with what the peer chooses to send."""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Iterable

# Far above any line an engine writes (vLLM's longest, vllm:cache_config_info with its 37
# labels, is about 2 kB), far below what would cost memory. A longer line of a family that is
# not read is skipped unread; one of a family that is read makes the page unreadable.
LINE_LIMIT = 64 * 1024
# Past 2**53 a float no longer counts by ones: no counter of requests or seconds gets there.
COUNTER_LIMIT = float(2**53)


class Labels:
    """A sample's labels as written between its braces, each read when asked for (escapes kept
    as sent): a probe needs one label of vllm:cache_config_info's 37, and reading them all
    cost more than the rest of its page. ValueError for a value that is not UTF-8."""

    __slots__ = ("text",)

    def __init__(self, text: bytes) -> None:
        self.text = text

    def get(self, key: str) -> str | None:
        # `,key="` inside another label's value (a client's model name, a tenant's fairness id)
        # is part of that value: a match counts only where the quotes before it are even.
        # Counted a stretch at a time, so that a line of such decoys costs its length once.
        text, pattern = self.text, _label(key)
        match = pattern.search(text)
        counted = quotes = 0
        while match is not None:
            stretch = text[counted : match.start()]
            if b"\\" in stretch:
                stretch = _ESCAPE.sub(b"", stretch)
            quotes += stretch.count(b'"')
            counted = match.start()
            if quotes % 2 == 0:
                break
            match = pattern.search(text, counted + 1)
        if match is None:
            return None
        try:
            return match.group(1).decode()
        except UnicodeDecodeError:
            raise ValueError(f"the label {key} is not UTF-8: {_quoted(self.text)}") from None


_ESCAPE = re.compile(rb"\\.", re.DOTALL)


@functools.lru_cache(maxsize=256)
def _label(key: str) -> re.Pattern[bytes]:
    return re.compile(rb"(?:^|,)\s*" + re.escape(key.encode()) + rb'\s*=\s*"((?:[^"\\]|\\.)*)"')


def _quoted(raw: bytes) -> str:
    """The start of a line the peer sent, as a message may show it."""
    return repr(raw[:80].decode(errors="replace"))


OnSample = Callable[[str, Labels, float], None]


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
        self._names, self._prefixes = _encoded(self._wanted)
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
        # Read as bytes: a probe's page is a few such lines, read every few seconds from
        # thousands of engines, and decoding each was a good part of their cost.
        if len(raw) > LINE_LIMIT:
            raise ValueError(f"a line longer than {LINE_LIMIT // 1024} KiB")
        brace = raw.find(b"{")
        space = raw.find(b" ")
        if brace != -1 and (space == -1 or brace < space):
            close = raw.rfind(b"}")
            if close < brace:
                raise ValueError(f"unclosed labels: {_quoted(raw)}")
            name, text, rest = (
                self._names.get(raw[:brace]),
                raw[brace + 1 : close],
                raw[close + 1 :],
            )
        else:
            if space == -1:
                raise ValueError(f"no value: {_quoted(raw)}")
            name, text, rest = self._names.get(raw[:space]), b"", raw[space:]
        if name is None:
            return  # a longer name that starts like a wanted one
        words = rest.split()
        if not words:
            raise ValueError(f"no value: {_quoted(raw)}")
        try:
            value = float(words[0])
        except ValueError:
            raise ValueError(f"not a number: {_quoted(raw)}") from None
        # The labels as written: a series sent twice the same way, as a broken collector would
        # (one that lies can send any count it likes; the values are checked, not the intent).
        # Python's hash of bytes is salted per process: a peer cannot craft a collision.
        series = hash((name, text))
        if series in self._seen:
            raise ValueError(f"a series sent twice: {_quoted(raw)}")
        if len(self._seen) >= self._series_limit:
            raise ValueError(
                f"more than {self._series_limit} series of {', '.join(sorted(self._wanted))}"
            )
        self._seen.add(series)
        self._on_sample(name, Labels(text), value)


@functools.cache
def _encoded(wanted: frozenset[str]) -> tuple[dict[bytes, str], tuple[bytes, ...]]:
    # A page is made per probe, from one of a few sets of families.
    names = {name.encode(): name for name in wanted}
    return names, tuple(sorted(names))


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
