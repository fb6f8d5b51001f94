"""Duration strings as users write them in a spec, and on the command line."""

from __future__ import annotations

import argparse
import re

import pytest

from snooze.api.durations import (
    DurationError,
    duration_flag,
    format_duration,
    parse_duration,
    parse_seconds,
)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30), ("10m", 600), ("2h", 7200), ("1h30m", 5400), ("1.5s", 1.5), ("250ms", 0.25)],
)
def test_parse(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "10", "ten minutes", "10 m", "-5s", "1d", "m10"])
def test_refused_with_an_example(text: str) -> None:
    with pytest.raises(DurationError, match="such as '30s'"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.25, "250ms"), (1.234, "1.23s"), (42, "42s"), (725, "12m5s"), (7320, "2h2m")],
)
def test_format(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize("text", ["9" * 400 + "s", "2562048h", "99999999999999999999h"])
def test_longer_than_kubernetes_can_represent_is_refused(text: str) -> None:
    # A 400-digit number of seconds used to parse as infinity: an idle timer that never fires.
    with pytest.raises(DurationError, match="292 years"):
        parse_duration(text)


def test_the_longest_go_duration_is_accepted() -> None:
    assert parse_duration("2562047h") == 2562047 * 3600


def test_a_spec_with_an_endless_duration_names_the_field() -> None:
    from snooze.api.models import SpecError, parse_spec

    selector = {"matchLabels": {"a": "b"}}
    with pytest.raises(SpecError, match=r"spec\.idle\.after: .*292 years"):
        parse_spec({"selector": selector, "idle": {"after": "99999999999999999999h"}})
    # The API server refuses absurdly long strings before the operator sees them (maxLength).
    with pytest.raises(SpecError, match=r"spec\.idle\.after: .*at most 32 characters"):
        parse_spec({"selector": selector, "idle": {"after": "9" * 400 + "s"}})


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        *[("10", 10), ("2.5", 2.5), (".5", 0.5), ("5.", 5), ("5e-05", 5e-05), ("0", 0)],
        *[("10s", 10), ("1m30s", 90), ("500ms", 0.5), ("1h", 3600)],
    ],
)
def test_a_command_line_takes_seconds_or_a_duration(text: str, seconds: float) -> None:
    assert parse_seconds(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("-5", "is negative"),
        ("-5s", "is negative"),
        ("nan", "is not a duration: write seconds (10, 2.5) or a number and a unit"),
        ("inf", "is not a duration"),
        ("10 s", "is not a duration"),
        ("1d", "is not a duration"),
        ("", "is not a duration"),
        ("1e400", "292 years"),
        ("9" * 30, "292 years"),
    ],
)
def test_a_command_line_refuses(text: str, says: str) -> None:
    with pytest.raises(DurationError, match=re.escape(says)):
        parse_seconds(text)


def test_a_flag_refuses_zero_unless_it_may_be() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="greater than zero"):
        duration_flag()("0s")
    assert duration_flag(zero=True)("0s") == 0
    with pytest.raises(argparse.ArgumentTypeError, match="is not a duration"):
        duration_flag(zero=True)("soon")
