"""The routes vLLM added for weight updates (its RL entry points): /pause, /resume,
/is_paused, /weight_info and /weight_checker, each as the simulated release serves it
(sim/contract.py names the release each appeared in)."""

from __future__ import annotations

import functools
import json
from typing import Any

from aiohttp import web

from snooze.sim.engine import SLEEP_MODES, SimulatedEngine, WakeError
from snooze.sim.responses import ENGINE_KEY, http_exception, invalid_field, server_error

CHECKER_ACTIONS = ("checksum", "reset", "compare")
COMPACT = functools.partial(json.dumps, separators=(",", ":"))


def add_routes(app: web.Application, engine: SimulatedEngine) -> None:
    """Mount the routes the engine's release has; 0.12 to 0.15 mount /pause and its siblings
    even without dev mode, later releases only with it."""
    contract = engine.contract
    dev = engine.config.dev_mode
    if contract.pause_routes and (dev or not contract.pause_needs_dev_mode):
        app.router.add_post("/pause", pause)
        app.router.add_post("/resume", resume)
        app.router.add_get("/is_paused", is_paused)
    if dev and contract.weight_info:
        app.router.add_get("/weight_info", weight_info)
    if dev and contract.weight_checker:
        app.router.add_post("/weight_checker", weight_checker)


def _engine(request: web.Request) -> SimulatedEngine:
    return request.app[ENGINE_KEY]


def _flag(text: str) -> bool | None:
    """A boolean query parameter as FastAPI reads one; None if it is not one."""
    lowered = text.lower()
    if lowered in ("1", "true", "on", "yes"):
        return True
    if lowered in ("0", "false", "off", "no"):
        return False
    return None


async def pause(request: web.Request) -> web.Response:
    engine = _engine(request)
    contract = engine.contract
    mode = "abort"
    if contract.pause_modes:
        mode = request.query.get("mode", "abort")
        if mode not in SLEEP_MODES:
            message = "Input should be 'abort', 'wait' or 'keep'"
            return invalid_field(engine, "query", "mode", message, mode)
    if contract.pause_wait_flag and "wait_for_inflight_requests" in request.query:
        wait = _flag(request.query["wait_for_inflight_requests"])
        if wait is None:
            message = "Input should be a valid boolean, unable to interpret input"
            value = request.query["wait_for_inflight_requests"]
            return invalid_field(engine, "query", "wait_for_inflight_requests", message, value)
        if wait:
            mode = "wait"  # the deprecated flag, as vLLM maps it
    await engine.pause(mode)
    return web.json_response({"status": "paused"})


async def resume(request: web.Request) -> web.Response:
    await _engine(request).resume()
    return web.json_response({"status": "resumed"})


async def is_paused(request: web.Request) -> web.Response:
    return web.json_response({"is_paused": _engine(request).is_paused})


async def weight_info(request: web.Request) -> web.Response:
    # vLLM's engine core starts at "default" until a weight update names a version.
    return web.json_response({"weight_version": "default"})


async def weight_checker(request: web.Request) -> web.Response:
    engine = _engine(request)
    try:
        body: Any = await request.json()
    except json.JSONDecodeError:
        body = None
    action = body.get("action") if isinstance(body, dict) else None
    if action not in CHECKER_ACTIONS:
        message = "Input should be 'checksum', 'reset' or 'compare'"
        return invalid_field(engine, "body", "action", message, action)
    baseline = body.get("baseline")
    if action == "reset":
        await engine.reset_weights()
        return web.json_response({"status": "reset"})
    if action == "compare" and baseline is None:
        return http_exception(engine, 400, "action='compare' requires a 'baseline' object")
    if action == "compare" and not (
        isinstance(baseline, dict) and all(isinstance(v, str) for v in baseline.values())
    ):
        message = "Input should be a valid dictionary"
        return invalid_field(engine, "body", "baseline", message, baseline)
    try:
        checksums = await engine.weight_checksums()
    except WakeError as exc:
        return server_error(engine, str(exc))
    if action == "checksum":
        # As Starlette's JSONResponse prints it (no spaces): about 129 bytes a tensor and rank.
        return web.json_response({"checksums": checksums}, dumps=COMPACT)
    mismatches = sorted(
        key for key in checksums.keys() | baseline.keys() if checksums.get(key) != baseline.get(key)
    )
    return web.json_response({"match": not mismatches, "mismatches": mismatches})
