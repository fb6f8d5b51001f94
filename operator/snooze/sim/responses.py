"""What every route of a simulated engine shares: the engine it serves, and vLLM's error
shapes as its release prints them (sim/contract.py says which release prints which)."""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from aiohttp import web

from snooze.sim.contract import DETAIL, NESTED
from snooze.sim.engine import SimulatedEngine

ENGINE_KEY = web.AppKey("engine", SimulatedEngine)


def _body(shape: str, status: int, message: str, kind: str, param: str | None) -> Any:
    if shape == NESTED:
        return {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return {"object": "error", "message": message, "type": kind, "param": param, "code": status}


def error(
    engine: SimulatedEngine, status: int, message: str, kind: str, param: str | None = None
) -> web.Response:
    """vLLM's own ErrorResponse (what its OpenAI routes answer), flat or nested by release."""
    body = _body(engine.contract.error_body, status, message, kind, param)
    return web.json_response(body, status=status)


def http_exception(engine: SimulatedEngine, status: int, detail: str) -> web.Response:
    """An HTTPException a route raises: FastAPI's `{"detail": ...}` before vLLM 0.9.0 had a
    handler for it, then vLLM's ErrorResponse with the status's phrase as its type."""
    shape = engine.contract.http_errors
    if shape == DETAIL:
        return web.json_response({"detail": detail}, status=status)
    body = _body(shape, status, detail, HTTPStatus(status).phrase, None)
    return web.json_response(body, status=status)


def invalid_field(
    engine: SimulatedEngine, where: str, name: str, message: str, value: Any
) -> web.Response:
    """A parameter that fails its declared type: vLLM's validation handler answers 400 (never
    FastAPI's 422), its message the pydantic errors, its `param` the field from 0.25.0."""
    contract = engine.contract
    item = {"type": "literal_error", "loc": (where, name), "msg": message, "input": value}
    kind = "BadRequestError" if contract.release < (0, 9, 0) else HTTPStatus.BAD_REQUEST.phrase
    param = f"{where}.{name}" if contract.release >= (0, 25, 0) else None
    body = _body(contract.error_body, 400, f"1 validation error:\n  {item}", kind, param)
    return web.json_response(body, status=400)


def server_error(engine: SimulatedEngine, message: str) -> web.Response:
    """An exception a route does not catch (a failed utility call, such as a wake that crashed):
    vLLM's JSON 500 from 0.18.0, Starlette's plain text before."""
    if not engine.contract.server_errors_json:
        return web.Response(status=500, text="Internal Server Error")
    return error(engine, 500, message, "InternalServerError")


def value_error(engine: SimulatedEngine, message: str) -> web.Response:
    """A ValueError a route does not catch: from 0.18.0 vLLM's handler calls it the client's
    fault (400); before, Starlette's plain 500."""
    if not engine.contract.server_errors_json:
        return web.Response(status=500, text="Internal Server Error")
    return error(engine, 400, message, "BadRequestError")


def not_found() -> web.Response:
    """A route the server does not have: FastAPI's own 404, in every release."""
    return web.json_response({"detail": "Not Found"}, status=404)
