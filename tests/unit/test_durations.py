"""Duration strings as users write them in a spec."""

from __future__ import annotations

import pytest

from snooze.durations import DurationError, format_duration, parse_duration


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
