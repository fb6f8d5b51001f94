"""The tests' waits: they return what they waited for, and fail saying where it never came."""

from __future__ import annotations

import asyncio

import pytest
from waits import until, wait_for


async def test_until_returns_what_the_condition_became() -> None:
    answers = iter([0, None, "ready"])
    assert await until(lambda: next(answers)) == "ready"


async def test_until_awaits_a_condition_that_is_a_coroutine() -> None:
    event = asyncio.Event()
    asyncio.get_running_loop().call_later(0.01, event.set)

    async def is_set() -> bool:
        return event.is_set()

    assert await until(is_set) is True


async def test_until_fails_naming_the_condition_and_its_last_answer() -> None:
    with pytest.raises(
        AssertionError, match=r"0\.05 s waiting for .*test_waits\.py:\d+ \(last: 0\)"
    ):
        await until(lambda: 0, within=0.05)


def test_wait_for_fails_with_what_never_came() -> None:
    with pytest.raises(AssertionError, match="waiting for the moon"):
        wait_for("the moon", lambda: False, timeout=0.05)
