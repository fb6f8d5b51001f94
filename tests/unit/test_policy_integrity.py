"""What a woken engine's checks mean (policy/integrity.py), and how the sleep policy treats an
engine that woke answering differently, or whose release a known bug concerns: tables."""

from __future__ import annotations

from typing import Any

import pytest

from snooze.api.reasons import FailureReason
from snooze.policy.integrity import Answer, Check, judge, recorded, weights_verdict
from snooze.policy.sleep import ActionKind, decide, next_idle_deadline

from .test_policy import (
    ASLEEP,
    AWAKE,
    FAILED,
    IDLE,
    NOW,
    asleep,
    awake,
    model,
    spec,
    summary,
)

BEFORE = Answer.of(route="/v1/completions", tokens=[11, 12, 13, 14], text="one two")
SAME = Answer.of(route="/v1/completions", tokens=[11, 12, 13, 14], text="one two")
OTHER = Answer.of(route="/v1/completions", tokens=[11, 12, 99, 14], text="one two")


def test_answers_compare_by_token_ids_or_else_by_text() -> None:
    assert BEFORE.same_as(SAME) and not BEFORE.same_as(OTHER)
    no_ids = Answer.of(route="/v1/completions", tokens=None, text="one two")
    assert no_ids.same_as(BEFORE) and BEFORE.same_as(no_ids)  # an engine without ids: the text
    assert not no_ids.same_as(Answer.of(route="/v1/completions", tokens=None, text="one"))
    assert "tokens [11, 12, 99, 14]" in OTHER.shown()


def test_a_first_record_that_already_varies_is_not_checked() -> None:
    assert recorded(BEFORE, SAME) is Check.RECORDED
    assert recorded(BEFORE, OTHER) is Check.NOT_DETERMINISTIC


@pytest.mark.parametrize(
    ("first", "second", "state"),
    [
        (SAME, None, Check.VERIFIED),
        (OTHER, SAME, Check.NOT_DETERMINISTIC),  # wrong once, right the second time: it varies
        (OTHER, OTHER, Check.MISMATCH),
    ],
)
def test_a_wake_is_judged_on_one_answer_or_two(
    first: Answer, second: Answer | None, state: Check
) -> None:
    verdict = judge(BEFORE, first, second)
    assert verdict.state is state and verdict.failed is (state is Check.MISMATCH)
    if verdict.failed:
        assert "[11, 12, 13, 14]" in verdict.message and "[11, 12, 99, 14]" in verdict.message


def test_weights_verdicts_name_what_differs_when_they_can() -> None:
    assert weights_verdict("a" * 64, 290, "a" * 64, None).state is Check.VERIFIED
    named = weights_verdict("a" * 64, 290, "b" * 64, ["tp0:x", "tp1:x", "tp0:y", "tp1:y"])
    assert (
        named.failed
        and "4 of 290 weight tensors differ (tp0:x, tp1:x, tp0:y, ...)" in named.message
    )
    assert "digest differs" in weights_verdict("a" * 64, 290, "b" * 64, None).message


def quarantined(pod: str, **kw: Any) -> Any:
    """Awake, labelled failed: it woke answering differently."""
    args: dict[str, Any] = {
        "label": FAILED,
        "quarantined": True,
        "wake_failures": 1,
        "last_failure": NOW - 5,
        "last_failure_reason": FailureReason.OUTPUT_MISMATCH,
    }
    return awake(pod, **(args | kw))


@pytest.mark.parametrize(
    ("on_failure", "expected"),
    [("Restart", ["Restart a"]), ("Report", [])],
)
def test_an_engine_that_woke_answering_differently_gets_only_its_remedy(
    on_failure: str, expected: list[str]
) -> None:
    """Never published awake (the engine is awake, its label stays failed), never woken,
    never slept; restarted, or left failed."""
    actions = decide(
        [quarantined("a", idle_for=IDLE * 2)], model(spec(on_failure=on_failure), requested_ago=1)
    )
    assert summary(actions) == expected


def test_a_quarantined_engine_labelled_otherwise_is_labelled_failed() -> None:
    actions = decide([quarantined("a", label=AWAKE)], model(spec(on_failure="Report")))
    assert summary(actions) == ["Label a=failed"]


def test_a_quarantined_engine_does_not_count_for_min_awake() -> None:
    actions = decide([quarantined("a"), asleep("b")], model(spec(min_awake=1, on_failure="Report")))
    assert summary(actions) == ["Wake b"]


def test_a_quarantined_engine_has_no_idle_deadline() -> None:
    assert next_idle_deadline([quarantined("a", idle_for=10)], model()) is None


def test_a_known_bug_moves_the_level_and_asks_for_a_drained_sleep() -> None:
    [action] = decide([awake("a", idle_for=IDLE * 2, fallback_level=2, drained_only=True)], model())
    assert (action.kind, action.level, action.drained_only) == (ActionKind.SLEEP, 2, True)


def test_no_safe_level_means_no_sleep_even_to_make_room() -> None:
    """sleep_blocked (no sleep mode, or a known bug with no safe level): not slept when idle,
    nor when its GPU pool chooses it to make room."""
    blocked = awake("a", idle_for=IDLE * 2, sleep_blocked=True, pooled=True, pool_evict=True)
    assert decide([blocked], model()) == []


def test_a_wake_follows_the_level_the_engine_slept_at_not_the_fallback() -> None:
    [action] = decide(
        [asleep("a", sleep_level=2, fallback_level=1, label=ASLEEP)], model(requested_ago=1)
    )
    assert (action.kind, action.level) == (ActionKind.WAKE, 2)
