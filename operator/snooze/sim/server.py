"""One simulated engine's aiohttp application: vLLM's OpenAI routes, dev-mode admin, metrics."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from snooze.sim import metrics, rl, serverinfo
from snooze.sim.engine import (
    SLEEP_MODES,
    EngineDead,
    EnginePaused,
    Request,
    SimulatedEngine,
    WakeError,
)
from snooze.sim.responses import (
    ENGINE_KEY,
    error,
    http_exception,
    invalid_field,
    not_found,
    server_error,
    value_error,
)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def fastapi_not_found(request: web.Request, handler: Handler) -> web.StreamResponse:
    # vLLM is FastAPI: an unknown route (dev mode off) answers FastAPI's JSON, not aiohttp's text.
    # Every request is counted by method and path first, so that tests can assert on what the
    # engine saw (an admin route reached through the gateway, say), whatever it answered.
    request.app[ENGINE_KEY].seen[f"{request.method} {request.path}"] += 1
    try:
        return await handler(request)
    except web.HTTPNotFound:
        return not_found()
    except web.HTTPMethodNotAllowed:
        return web.json_response({"detail": "Method Not Allowed"}, status=405)


@web.middleware
async def until_loaded(request: web.Request, handler: Handler) -> web.StreamResponse:
    # A vLLM that could not get its memory exits and its container restarts: nothing answers.
    # The simulator answers 503 instead (a failing readiness probe, as /health says when the
    # engine is dead), with vLLM's reason; /metrics stays up so that the refusals can be counted.
    engine = request.app[ENGINE_KEY]
    if engine.loaded or request.path.startswith("/metrics"):
        return await handler(request)
    if request.path == "/health":
        return web.Response(status=503)
    refusal = engine.start_refusal
    message = f"ValueError: {refusal}" if refusal is not None else "The model is loading."
    return error(engine, 503, message, "ServiceUnavailableError")


def build_app(engine: SimulatedEngine) -> web.Application:
    """One engine's routes, those of the release it speaks for; the admin ones exist only in
    dev mode, as in vLLM."""
    app = web.Application(middlewares=[fastapi_not_found, until_loaded])
    app[ENGINE_KEY] = engine
    app.router.add_get("/health", health)
    app.router.add_get("/version", version)
    # GET /metrics is the instrumentator's from 0.8.5 (the whole page); every other path
    # under /metrics reaches prometheus_client's mount, which filters (sim/contract.py).
    app.router.add_get("/metrics", metrics_route)
    app.router.add_get("/metrics{tail:.+}", filtered_metrics_route)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    if engine.config.dev_mode:
        app.router.add_post("/sleep", sleep)
        app.router.add_post("/wake_up", wake_up)
        app.router.add_get("/is_sleeping", is_sleeping)
        if engine.contract.collective_rpc:
            app.router.add_post("/collective_rpc", collective_rpc)
        if engine.contract.release_kv_cache_memory:
            app.router.add_post("/release_kv_cache_memory", release_kv_cache_memory)
        app.router.add_post("/reset_prefix_cache", reset_prefix_cache)
    rl.add_routes(app, engine)
    serverinfo.add_routes(app, engine)
    return app


def _engine(request: web.Request) -> SimulatedEngine:
    return request.app[ENGINE_KEY]


async def health(request: web.Request) -> web.Response:
    # 200 while asleep and after a failed wake: that is exactly what makes vLLM's /health useless
    # as a wake probe.
    return web.Response(status=200)


async def version(request: web.Request) -> web.Response:
    return web.json_response({"version": _engine(request).config.vllm_version})


async def metrics_route(request: web.Request) -> web.Response:
    filters = _engine(request).contract.metrics_route_filters
    return _metrics_page(request, filtered=filters)


async def filtered_metrics_route(request: web.Request) -> web.Response:
    return _metrics_page(request, filtered=True)


def _metrics_page(request: web.Request, *, filtered: bool) -> web.Response:
    names = request.query.getall("name[]") if filtered and "name[]" in request.query else None
    text = metrics.render(_engine(request), names)
    return web.Response(body=text.encode(), headers={"Content-Type": metrics.CONTENT_TYPE})


async def models(request: web.Request) -> web.Response:
    cfg = _engine(request).config
    card = {
        "id": cfg.model,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "vllm",
        "root": cfg.model,
        "parent": None,
        "max_model_len": cfg.max_model_len,
    }
    return web.json_response({"object": "list", "data": [card]})


# --- dev-mode admin --------------------------------------------------------------------------


async def sleep(request: web.Request) -> web.Response:
    engine = _engine(request)
    contract = engine.contract
    text = request.query.get("level", "1")
    # Before 0.17 /sleep reads only its level: requests in flight are aborted.
    mode = request.query.get("mode", "abort") if contract.sleep_mode_param else "abort"
    if contract.sleep_query_validated:
        if not text.isdigit() or int(text) > 2:
            message = "Input should be greater than or equal to 0 and less than or equal to 2"
            return invalid_field(engine, "query", "level", message, text)
        if mode not in SLEEP_MODES:
            message = "Input should be 'abort', 'wait' or 'keep'"
            return invalid_field(engine, "query", "mode", message, mode)
    else:
        # int(level) and the mode read raw: what they refuse is an uncaught exception.
        if not text.lstrip("-").isdigit():
            return value_error(engine, f"invalid literal for int() with base 10: {text!r}")
        if mode not in SLEEP_MODES:  # raised inside the engine core: a failed utility call
            return server_error(engine, f"Call to sleep method failed: Invalid pause mode: {mode}")
    level = int(text)
    slept = await engine.sleep(level, mode)
    if not contract.json_sleep_answers:
        return web.Response(status=200)
    return web.json_response({"status": "sleeping", "level": slept})


async def wake_up(request: web.Request) -> web.Response:
    tags = request.query.getall("tags") if "tags" in request.query else None
    engine = _engine(request)
    try:
        awake = await engine.wake_up(tags)
    except WakeError as exc:
        return server_error(engine, str(exc))
    if not engine.contract.json_sleep_answers:
        return web.Response(status=200)
    # vLLM 0.33 echoes the tags it was given: null when none (everything was asked for).
    return web.json_response({"status": "awake" if awake else "sleeping", "tags": tags})


async def is_sleeping(request: web.Request) -> web.Response:
    return web.json_response({"is_sleeping": _engine(request).is_sleeping})


async def release_kv_cache_memory(request: web.Request) -> web.Response:
    engine = _engine(request)
    try:
        await engine.release_kv_cache()
    except WakeError as exc:
        return server_error(engine, str(exc))
    if not engine.contract.json_sleep_answers:
        return web.Response(status=200)
    return web.json_response({"status": "kv_cache_released"})


async def collective_rpc(request: web.Request) -> web.Response:
    engine = _engine(request)
    try:
        body = await request.json()
    except json.JSONDecodeError as exc:
        return http_exception(engine, 400, f"JSON decode error: {exc}")
    if not isinstance(body, dict):
        return http_exception(engine, 400, "Request body must be a JSON object")
    method = body.get("method")
    if method is None:
        return http_exception(engine, 400, "Missing 'method' in request body")
    if method != "reload_weights":
        return server_error(engine, f"AttributeError: 'Worker' object has no attribute '{method}'")
    try:
        await engine.reload_weights()
    except WakeError as exc:
        return server_error(engine, str(exc))
    # One result per worker; reload_weights returns None.
    return web.json_response({"results": [None]})


async def reset_prefix_cache(request: web.Request) -> web.Response:
    return web.Response(status=200)


# --- inference ---------------------------------------------------------------------------------


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=True)


def _prompt_text(body: dict[str, Any], chat: bool) -> str:
    """The prompt's words: the messages' contents one after the other for chat."""
    if chat:
        parts: list[Any] = []
        for message in body.get("messages") or []:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, list):
                parts.extend(p.get("text", "") for p in content if isinstance(p, dict))
            elif content is not None:
                parts.append(content)
    else:
        prompt = body.get("prompt", "")
        parts = prompt if isinstance(prompt, list) else [prompt]
    return "\n".join(str(part) for part in parts)


def _validate(engine: SimulatedEngine, body: Any, chat: bool) -> web.Response | None:
    if not isinstance(body, dict):
        return error(engine, 400, "The request body must be a JSON object.", "BadRequestError")
    if body.get("model") != engine.config.model:
        message = f"The model `{body.get('model')}` does not exist."
        return error(engine, 404, message, "NotFoundError", "model")
    if chat and not isinstance(body.get("messages"), list):
        return error(engine, 400, "Field required: messages", "BadRequestError", "messages")
    if not chat and "prompt" not in body:
        return error(engine, 400, "Field required: prompt", "BadRequestError", "prompt")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        return error(engine, 400, "max_tokens must be at least 1", "BadRequestError", "max_tokens")
    return None


async def _generate(request: web.Request, *, chat: bool) -> web.StreamResponse:
    engine = _engine(request)
    try:
        body = await request.json()
    except json.JSONDecodeError as exc:
        return error(engine, 400, f"JSON decode error: {exc}", "BadRequestError")
    invalid = _validate(engine, body, chat)
    if invalid is not None:
        return invalid
    asked = body.get("max_completion_tokens", body.get("max_tokens"))
    limit = asked if asked is not None else engine.config.max_tokens_default
    prompt = _prompt_text(body, chat)
    sim = Request(prompt_tokens=max(1, len(prompt.split())), max_tokens=limit, prompt=prompt)
    reply = Reply(engine, sim, chat=chat, stream=bool(body.get("stream")))
    # vLLM 0.10.2+ returns the generated token ids when asked (return_token_ids).
    reply.token_ids = bool(body.get("return_token_ids")) and engine.contract.token_ids
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    reason = "abort"
    try:
        try:
            await engine.admit(sim)
        except EnginePaused as exc:
            return error(engine, 503, str(exc), "ServiceUnavailableError")
        if reply.stream:
            await reply.start(request)
        pieces: list[str] = []
        for index in range(limit):
            token = await engine.next_token(sim, index)
            if token is None:
                break
            piece = token if index == 0 else " " + token
            pieces.append(piece)
            if reply.stream:
                await reply.send(reply.chunk(piece, None))
        else:
            # A request that set max_tokens ran into it; otherwise the filler "ends naturally".
            reason = "length" if asked is not None else "stop"
        if not reply.stream:
            return web.json_response(reply.full("".join(pieces), reason))
        await reply.send(reply.chunk("", reason))
        if include_usage:
            await reply.send(reply.usage_chunk())
        await reply.send_raw(b"data: [DONE]\n\n")
        return reply.started
    except (EngineDead, ConnectionResetError):
        # The pod died or the client left: nothing more can be sent on this connection.
        return reply.response if reply.response is not None else web.Response(status=503)
    finally:
        await engine.finish(sim, reason)


class Reply:
    """Builds the OpenAI-shaped bodies and chunks of one answer."""

    def __init__(self, engine: SimulatedEngine, sim: Request, *, chat: bool, stream: bool):
        self.engine = engine
        self.sim = sim
        self.chat = chat
        self.stream = stream
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.response: web.StreamResponse | None = None
        self._first = True
        self.token_ids = False
        """Add the generated token ids to each choice (the request's return_token_ids)."""

    def _head(self, kind: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.engine.config.model,
        }

    def usage(self) -> dict[str, Any]:
        prompt, done = self.sim.prompt_tokens, self.sim.generated
        return {
            "prompt_tokens": prompt,
            "total_tokens": prompt + done,
            "completion_tokens": done,
            "prompt_tokens_details": None,
        }

    def full(self, text: str, reason: str) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": 0,
            "logprobs": None,
            "finish_reason": reason,
            "stop_reason": None,
        }
        if self.chat:
            choice["message"] = {
                "role": "assistant",
                "content": text,
                "refusal": None,
                "tool_calls": [],
                "reasoning_content": None,
            }
            kind = "chat.completion"
        else:
            choice["text"] = text
            choice["prompt_logprobs"] = None
            kind = "text_completion"
        if self.token_ids:
            choice["token_ids"] = list(self.sim.token_ids)
        return {
            **self._head(kind),
            "choices": [choice],
            "usage": self.usage(),
            "system_fingerprint": None,
        }

    def chunk(self, piece: str, reason: str | None) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": 0,
            "logprobs": None,
            "finish_reason": reason,
            "stop_reason": None,
        }
        if self.chat:
            delta: dict[str, Any] = {"content": piece}
            if self._first:
                delta = {"role": "assistant", **delta}
            choice["delta"] = delta
        else:
            choice["text"] = piece
        if self.token_ids:
            choice["token_ids"] = self.sim.token_ids[-1:] if piece else []
        self._first = False
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self._head(kind), "choices": [choice]}

    def usage_chunk(self) -> dict[str, Any]:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self._head(kind), "choices": [], "usage": self.usage()}

    @property
    def started(self) -> web.StreamResponse:
        assert self.response is not None
        return self.response

    async def start(self, request: web.Request) -> None:
        self.response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await self.response.prepare(request)

    async def send(self, payload: dict[str, Any]) -> None:
        await self.send_raw(b"data: " + json.dumps(payload).encode() + b"\n\n")

    async def send_raw(self, data: bytes) -> None:
        assert self.response is not None
        await self.response.write(data)
