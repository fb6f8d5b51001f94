"""What every route of a simulated engine shares: the engine it serves, and vLLM's error
shapes (OpenAI's for the inference routes, FastAPI's for the others)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from snooze.sim.engine import SimulatedEngine

ENGINE_KEY = web.AppKey("engine", SimulatedEngine)


def error(status: int, message: str, kind: str, param: str | None = None) -> web.Response:
    """An OpenAI-shaped error, as vLLM's ErrorResponse prints it."""
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return web.json_response(body, status=status)


def detail(status: int, message: Any) -> web.Response:
    """FastAPI's error shape (an HTTPException, or a validation error's list)."""
    return web.json_response({"detail": message}, status=status)


def invalid_field(where: str, name: str, message: str, value: Any) -> web.Response:
    """FastAPI's 422 for a parameter that fails its declared type."""
    item = {"type": "literal_error", "loc": [where, name], "msg": message, "input": value}
    return detail(422, [item])
