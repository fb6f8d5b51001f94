"""What an engine's answers can be believed to say, given its vLLM release: tables of cases
written from the wheels (docs/vllm-contract.md)."""

from __future__ import annotations

import pytest

from snooze.policy.releases import awake_gauge_believed, sleep_running


@pytest.mark.parametrize(
    ("in_flight", "release", "expected"),
    [
        (1, (0, 33, 0), True),
        (0, (0, 33, 0), False),
        # 0.32+ create the gauge at the first sleep or wake: none yet means none under way.
        (None, (0, 32, 0), False),
        (None, (0, 34, 0), False),
        (None, (0, 31, 0), None),  # no such gauge: the engine does not say
        (None, None, None),  # a release not known: nothing to conclude
    ],
)
def test_a_sleep_under_way(
    in_flight: int | None, release: tuple[int, int, int] | None, expected: bool | None
) -> None:
    assert sleep_running(in_flight, release) is expected


@pytest.mark.parametrize(
    ("release", "believed"),
    [
        ((0, 11, 1), False),
        ((0, 30, 0), False),
        ((0, 31, 0), True),
        ((0, 33, 0), True),
        (None, False),
    ],
)
def test_the_awake_gauge_is_believed_from_0_31(
    release: tuple[int, int, int] | None, believed: bool
) -> None:
    assert awake_gauge_believed(release) is believed
