"""The event loop the gateway runs on: uvloop where it is installed (its sockets and timers
are C, not Python; benchmarks/README.md has what it changes), else asyncio's own.

uvloop is a dependency on Linux and macOS; where it cannot be installed (Windows, an
interpreter it has no wheel for), the gateway runs on asyncio and says so in its first log
line. `--event-loop asyncio` asks for asyncio's loop even where uvloop is present.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

CHOICES = ("auto", "uvloop", "asyncio")


class LoopUnavailable(Exception):
    """The loop asked for by name is not installed here."""


def _uvloop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def factory(choice: str = "auto") -> tuple[str, Callable[[], asyncio.AbstractEventLoop]]:
    """The loop's name and a function making one, for `choice` (one of CHOICES)."""
    if choice not in CHOICES:
        raise ValueError(f"unknown event loop {choice!r}; choose one of {', '.join(CHOICES)}")
    if choice != "asyncio":
        made = _uvloop_factory()
        if made is not None:
            return "uvloop", made
        if choice == "uvloop":
            raise LoopUnavailable(
                "uvloop is not installed here (pip install uvloop), or use --event-loop asyncio"
            )
    return "asyncio", asyncio.new_event_loop


def describe(loop: asyncio.AbstractEventLoop) -> str:
    """Which loop this is, as `factory` names it."""
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
