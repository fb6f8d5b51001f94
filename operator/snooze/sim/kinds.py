"""Which engine a simulated server is, vLLM or SGLang: its state and its routes, chosen by the
kind of its config, so that one pool (and one shared device) can hold both."""

from __future__ import annotations

from aiohttp import web

from snooze.sim.device import SimulatedDevice
from snooze.sim.engine import EngineConfig, SimulatedEngine
from snooze.sim.server import build_app
from snooze.sim.sglang.engine import SGLangConfig, SGLangEngine
from snooze.sim.sglang.server import build_sglang_app


def new_engine(config: EngineConfig, device: SimulatedDevice | None) -> SimulatedEngine:
    """The engine a config describes: an SGLang server for an SGLangConfig, else vLLM."""
    if isinstance(config, SGLangConfig):
        return SGLangEngine(config, device)
    return SimulatedEngine(config, device)


def app_for(engine: SimulatedEngine) -> web.Application:
    """The engine's HTTP routes."""
    if isinstance(engine, SGLangEngine):
        return build_sglang_app(engine)
    return build_app(engine)
