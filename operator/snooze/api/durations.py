"""Kubernetes-style duration strings (`90s`, `10m`, `1h30m`) parsed to seconds and printed back."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable

# One or more <number><unit> pairs, as Go's time.ParseDuration reads them (without µs/ns,
# which no idle timer needs). The same pattern goes into the CRD so that the API server
# refuses what the operator could not parse.
DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"
_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
# Go's time.Duration is int64 nanoseconds: the API server's CEL `duration()` (and every Go
# client) refuses anything longer, so the operator does too, rather than read it as infinite.
MAX_SECONDS = (2**63 - 1) / 1e9
# A command line's plain number of seconds, as the flags always took (`10`, `2.5`, `.5`, and
# `5e-05` as Python prints a small float); no sign, infinity or NaN, which no timer can wait for.
_PLAIN_SECONDS = re.compile(r"([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?")


class DurationError(ValueError):
    """A duration string that is not of the form `30s`, `10m`, `2h` or `1h30m`."""


def parse_duration(text: str) -> float:
    """Return the number of seconds that `text` (such as `1h30m`) stands for."""
    if not re.fullmatch(DURATION_PATTERN, text):
        raise DurationError(
            f"{text!r} is not a duration: write a number and a unit (ms, s, m, h), "
            "such as '30s', '10m', '2h' or '1h30m'"
        )
    seconds = sum(float(value) * _UNIT_SECONDS[unit] for value, unit in _PART.findall(text))
    return _representable(text, seconds)


def parse_seconds(text: str) -> float:
    """A command line's duration: a plain number of seconds (`10`, `2.5`), or a duration as
    the specs write it (`10s`, `500ms`, `1h30m`)."""
    if text.startswith("-"):
        raise DurationError(f"{text!r} is negative: write a duration such as 10s, 500ms or 1m30s")
    if _PLAIN_SECONDS.fullmatch(text):
        return _representable(text, float(text))
    if re.fullmatch(DURATION_PATTERN, text):
        return parse_duration(text)
    raise DurationError(
        f"{text!r} is not a duration: write seconds (10, 2.5) or a number and a unit "
        "(ms, s, m, h), such as 10s, 500ms or 1m30s"
    )


def _representable(text: str, seconds: float) -> float:
    if seconds > MAX_SECONDS:
        raise DurationError(
            f"{text!r} is longer than the longest duration Kubernetes can represent "
            f"(about 292 years): write a shorter one"
        )
    return seconds


def duration_flag(*, zero: bool = False) -> Callable[[str], float]:
    """The argparse `type` of a flag that takes a duration (parse_seconds), greater than zero
    unless `zero`; argparse refuses a bad one with a line naming the flag, and exit status 2."""

    def parse(text: str) -> float:
        try:
            seconds = parse_seconds(text)
        except DurationError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if seconds == 0 and not zero:
            raise argparse.ArgumentTypeError(f"{text!r}: give a duration greater than zero")
        return seconds

    parse.__name__ = "duration"  # argparse names the type in some of its messages
    return parse


def format_duration(seconds: float) -> str:
    """Return a short human form of `seconds`: `850ms`, `42s`, `12m5s`, `3h2m`."""
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    if seconds < 60:
        return f"{seconds:.3g}s" if seconds < 10 else f"{round(seconds)}s"
    total = round(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m" if minutes else f"{hours}h"
    return f"{minutes}m{secs}s" if secs else f"{minutes}m"
