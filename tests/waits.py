"""Waiting in the tests: poll until something holds, and fail saying what never came."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any


def wait_for(
    what: str, predicate: Callable[[], Any], timeout: float = 15.0, *, every: float = 0.05
) -> Any:
    """Poll `predicate` every `every` seconds until it returns something truthy, and return
    that; fail with `what` and the last answer after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what} (last: {last!r})")


async def until(condition: Callable[[], Any], within: float = 5.0, *, every: float = 0.002) -> Any:
    """In a test's event loop: poll `condition` (sync, or returning an awaitable) every `every`
    seconds until it returns something truthy, and return that; fail naming where the
    condition is written after `within` seconds. Polling, not an event: the state it reads
    may live in another thread (a SimulatorHost's) or another task."""
    deadline = time.monotonic() + within
    last: Any = None
    while time.monotonic() < deadline:
        last = condition()
        if inspect.isawaitable(last):
            last = await last
        if last:
            return last
        await asyncio.sleep(every)
    code = getattr(condition, "__code__", None)
    where = f"{code.co_filename}:{code.co_firstlineno}" if code else repr(condition)
    raise AssertionError(f"timed out after {within:g} s waiting for {where} (last: {last!r})")
