"""A process that speaks vLLM's HTTP contract (sleep mode included), or SGLang's (release and
resume by tag): for tests, demo, benchmarks."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from snooze.sim.device import SimulatedDevice
from snooze.sim.engine import EngineConfig, SimulatedEngine

if TYPE_CHECKING:
    from snooze.sim.host import EnginePool, SimulatorHost, serve_engines

__all__ = [
    "EngineConfig",
    "EnginePool",
    "SimulatedDevice",
    "SimulatedEngine",
    "SimulatorHost",
    "serve_engines",
]
_LAZY = {"EnginePool", "SimulatorHost", "serve_engines"}


def __getattr__(name: str) -> Any:
    # The serving side imports aiohttp: load it on first use, so that `snooze sim --help` and
    # the other subcommands (which import snooze.sim.cli) stay fast.
    if name in _LAZY:
        return getattr(importlib.import_module("snooze.sim.host"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
