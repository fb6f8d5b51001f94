"""Waiting in the tests: poll until something holds, and fail saying what never came."""

from __future__ import annotations

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
