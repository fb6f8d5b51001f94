"""One simulated SGLang server's aiohttp application: its OpenAI routes, its native admin routes
(release and resume by tag, pause and continue, weight reload and checks) and its metrics, as
the release it speaks for serves them (srt/entrypoints/http_server.py)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from snooze.sim.engine import EngineDead, Request
from snooze.sim.metrics import CONTENT_TYPE
from snooze.sim.responses import ENGINE_KEY
from snooze.sim.server import Reply, _prompt_text, fastapi_not_found
from snooze.sim.sglang import metrics as sglang_metrics
from snooze.sim.sglang.engine import PAUSE_MODES, SGLangEngine

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
OPEN_PREFIXES = ("/health", "/ready", "/metrics")
"""Routes no key guards (utils/auth.py decide_request_auth: probes and scrapes)."""
ADMIN_ROUTES = frozenset(
    {
        "/release_memory_occupation",
        "/resume_memory_occupation",
        "/pause_generation",
        "/continue_generation",
        "/update_weights_from_disk",
        "/weights_checker",
        "/flush_cache",
    }
)
"""Routes marked ADMIN_OPTIONAL (0.5.8+): the admin key opens them, and no longer the API key."""


def _engine(request: web.Request) -> SGLangEngine:
    engine = request.app[ENGINE_KEY]
    assert isinstance(engine, SGLangEngine)
    return engine


def openai_error(status: int, message: str, kind: str) -> web.Response:
    """SGLang's ErrorResponse (entrypoints/openai/protocol.py)."""
    body = {"object": "error", "message": message, "type": kind, "param": None, "code": status}
    return web.json_response(body, status=status)


def admin_error(message: str, status: int = 400) -> web.Response:
    """What an admin route answers when its call raised (_create_error_response)."""
    return web.json_response({"error": {"message": message}}, status=status)


@web.middleware
async def dying(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except EngineDead:
        # Its process tree is being killed: nothing answers; the pool cuts the connection.
        await asyncio.Event().wait()
        raise


@web.middleware
async def keys(request: web.Request, handler: Handler) -> web.StreamResponse:
    """--api-key and --admin-api-key as utils/auth.py decides (0.5.8+; the API key alone
    before, on every route but /health and /metrics)."""
    engine = _engine(request)
    cfg = engine.config
    path = request.path
    if request.method == "OPTIONS" or path.startswith(OPEN_PREFIXES):
        return await handler(request)
    admin = cfg.admin_api_key if engine.sglang.admin_api_key else None
    wanted = (admin or cfg.api_key) if path in ADMIN_ROUTES else cfg.api_key
    if wanted and request.headers.get("Authorization") != f"Bearer {wanted}":
        return web.json_response({"error": "Unauthorized"}, status=401)
    return await handler(request)


@web.middleware
async def until_loaded(request: web.Request, handler: Handler) -> web.StreamResponse:
    # SGLang does not listen until its model is loaded; the simulator answers 503 meanwhile
    # (a failing readiness probe), and keeps its own gauges up.
    if _engine(request).loaded or request.path == "/metrics":
        return await handler(request)
    return web.Response(status=503)


def build_sglang_app(engine: SGLangEngine) -> web.Application:
    """The routes of the SGLang release the engine speaks for."""
    # Counted first (server.py's fastapi_not_found), so that tests can assert on what the
    # server saw whatever it answered; FastAPI's 404 and 405, as vLLM's.
    app = web.Application(middlewares=[fastapi_not_found, dying, keys, until_loaded])
    app[ENGINE_KEY] = engine
    contract = engine.sglang
    add = app.router.add_route
    add("GET", "/health", health)
    add("GET", "/health_generate", health)
    add("GET", "/get_server_info", server_info)
    add("GET", "/get_model_info", model_info)
    if contract.server_info:
        add("GET", "/server_info", server_info)
        add("GET", "/model_info", model_info)
    if contract.ready_route:
        add("GET", "/ready", ready)
    if engine.config.metrics:
        add("GET", "/metrics", metrics_route)
    add("GET", "/v1/models", models)
    add("POST", "/v1/completions", completions)
    add("POST", "/v1/chat/completions", chat_completions)
    for method in ("GET", "POST"):
        add(method, "/release_memory_occupation", release)
        add(method, "/resume_memory_occupation", resume)
        add(method, "/flush_cache", flush_cache)
        if contract.weights_checker:
            add(method, "/weights_checker", weights_checker)
    add("POST", "/pause_generation", pause_generation)
    add("POST", "/continue_generation", continue_generation)
    add("POST", "/update_weights_from_disk", update_weights_from_disk)
    return app


async def _body(request: web.Request) -> dict[str, Any] | web.Response:
    """The JSON object of an admin call (an empty body is `{}`), or FastAPI's 400 for one that
    is not (SGLang turns validation errors into 400)."""
    raw = await request.read()
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw)
    except ValueError as exc:
        return openai_error(400, f"JSON decode error: {exc}", "Bad Request")
    if not isinstance(data, dict):
        return openai_error(400, "Input should be a valid dictionary", "Bad Request")
    return data


def _tags(body: dict[str, Any]) -> list[str] | web.Response | None:
    tags = body.get("tags")
    if tags is None:
        return None
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        return openai_error(400, "tags: Input should be a valid list of strings", "Bad Request")
    return tags


# --- probes and facts ---------------------------------------------------------------------------


async def health(request: web.Request) -> web.Response:
    return web.Response(status=200 if await _engine(request).health() else 503)


async def ready(request: web.Request) -> web.Response:
    return web.Response(status=200 if _engine(request).ready else 503)


async def server_info(request: web.Request) -> web.Response:
    """The server's arguments (every one, its keys included: SGLang does not redact them) and
    its version."""
    engine = _engine(request)
    cfg = engine.config
    args: dict[str, Any] = {
        "model_path": engine.model_path,
        "served_model_name": cfg.model,
        "tp_size": cfg.tensor_parallel_size,
        "pp_size": cfg.pipeline_parallel_size,
        "enable_memory_saver": cfg.memory_saver,
        "enable_metrics": cfg.metrics,
        "api_key": cfg.api_key,
        "load_format": "auto",
    }
    if engine.sglang.weights_cpu_backup:
        args["enable_weights_cpu_backup"] = cfg.weights_cpu_backup
    if engine.sglang.admin_api_key:
        args["admin_api_key"] = cfg.admin_api_key
    internal = {"last_gen_throughput": 0.0, "memory_usage": {"weight": cfg.gpu_memory_gib}}
    return web.json_response({**args, "internal_states": [internal], "version": cfg.sglang_version})


async def model_info(request: web.Request) -> web.Response:
    engine = _engine(request)
    return web.json_response(
        {
            "model_path": engine.model_path,
            "served_model_name": engine.config.model,
            "is_generation": True,
            "weight_version": "default",
        }
    )


async def metrics_route(request: web.Request) -> web.Response:
    names = request.query.getall("name[]") if "name[]" in request.query else None
    text = sglang_metrics.render(_engine(request), names)
    return web.Response(body=text.encode(), headers={"Content-Type": CONTENT_TYPE})


async def models(request: web.Request) -> web.Response:
    engine = _engine(request)
    card = {
        "id": engine.config.model,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "sglang",
        "root": engine.model_path,
        "max_model_len": engine.config.max_model_len,
    }
    return web.json_response({"object": "list", "data": [card]})


# --- admin ----------------------------------------------------------------------------------------


async def release(request: web.Request) -> web.Response:
    return await _by_tags(request, "release_memory_occupation")


async def resume(request: web.Request) -> web.Response:
    return await _by_tags(request, "resume_memory_occupation")


async def _by_tags(request: web.Request, route: str) -> web.Response:
    """A release or a resume: `{"tags": [...]}` or none (all); the handler returns None, so
    FastAPI answers `null`."""
    engine = _engine(request)
    engine.count(route)
    body = await _body(request)
    if isinstance(body, web.Response):
        return body
    tags = _tags(body)
    if isinstance(tags, web.Response):
        return tags
    if route == "release_memory_occupation":
        await engine.release_memory(tags)
    else:
        await engine.resume_memory(tags)
    return web.json_response(None)


async def pause_generation(request: web.Request) -> web.Response:
    engine = _engine(request)
    engine.count("pause_generation")
    mode = "abort"
    if engine.sglang.pause_modes:  # before 0.5.6 the route takes no body: every pause aborts
        body = await _body(request)
        if isinstance(body, web.Response):
            return body
        mode = body.get("mode", "abort")
        if mode not in PAUSE_MODES:
            message = f"mode: Input should be 'abort', 'retract' or 'in_place', not {mode!r}"
            return openai_error(400, message, "Bad Request")
    await engine.pause_generation(mode)
    return web.json_response({"message": "Generation paused successfully.", "status": "ok"})


async def continue_generation(request: web.Request) -> web.Response:
    engine = _engine(request)
    engine.count("continue_generation")
    await engine.continue_generation()
    return web.json_response({"message": "Generation continued successfully.", "status": "ok"})


async def update_weights_from_disk(request: web.Request) -> web.Response:
    engine = _engine(request)
    body = await _body(request)
    if isinstance(body, web.Response):
        return body
    path = body.get("model_path")
    if not isinstance(path, str):
        return openai_error(400, "model_path: Field required", "Bad Request")
    ok, message = await engine.update_weights_from_disk(path)
    answer = {"success": ok, "message": message, "num_paused_requests": 0}
    return web.json_response(answer, status=200 if ok else 400)


async def weights_checker(request: web.Request) -> web.Response:
    """`checksum` (0.5.12+) digests every tensor; the other actions (snapshot copies the
    weights to host RAM, reset_tensors overwrites them) are refused here: Snooze never sends
    them, and a test that does learns it from the answer."""
    engine = _engine(request)
    body = await _body(request)
    if isinstance(body, web.Response):
        return body
    action = body.get("action", "checksum")
    if action != "checksum" or not engine.sglang.checksum_action:
        refused = {"success": False, "message": f"Unsupported action={action!r}"}
        return web.json_response(refused, status=400)
    per_rank = await engine.checksums()
    ranks: list[dict[str, Any]] = []
    for rank, checksums in enumerate(per_rank):
        info: dict[str, Any] = {"checksums": checksums}
        placement = {"tp_rank": rank, "tp_size": len(per_rank), "dp_rank": 0, "pp_rank": 0}
        if engine.sglang.per_engine_checksum:
            info["per_gpu_checksum"] = _overall(checksums)
            ranks.append({**info, "parallelism_info": [{"role": "target", **placement}]})
        else:
            ranks.append({**info, "parallelism_info": placement})
    answer: dict[str, Any] = {"success": True, "message": "Success.", "ranks": ranks}
    if engine.sglang.per_engine_checksum:
        answer["per_engine_checksum"] = _overall(
            {str(i): r["per_gpu_checksum"] for i, r in enumerate(ranks)}
        )
    return web.json_response(answer)


def _overall(checksums: dict[str, str]) -> str:
    """utils/weight_checker.py overall_checksum: SHA-256 of names and digests in name order."""
    hashed = hashlib.sha256()
    for name in sorted(checksums):
        hashed.update(name.encode())
        hashed.update(checksums[name].encode())
    return hashed.hexdigest()


async def flush_cache(request: web.Request) -> web.Response:
    return web.Response(text="Cache flushed.\n")


# --- inference ------------------------------------------------------------------------------------


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=True)


def _invalid(body: Any, chat: bool) -> web.Response | None:
    # SGLang serves whatever `model` a request names (its one model, or a LoRA adapter).
    if not isinstance(body, dict):
        return openai_error(400, "Input should be a valid dictionary", "Bad Request")
    if chat and not isinstance(body.get("messages"), list):
        return openai_error(400, "messages: Field required", "Bad Request")
    if not chat and "prompt" not in body:
        return openai_error(400, "prompt: Field required", "Bad Request")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        return openai_error(400, "max_tokens must be positive", "BadRequestError")
    return None


async def _generate(request: web.Request, *, chat: bool) -> web.StreamResponse:
    engine = _engine(request)
    if request.content_type != "application/json":
        return openai_error(400, "Unsupported Media Type: Only 'application/json'", "Bad Request")
    try:
        body = await request.json()
    except json.JSONDecodeError as exc:
        return openai_error(400, f"JSON decode error: {exc}", "Bad Request")
    invalid = _invalid(body, chat)
    if invalid is not None:
        return invalid
    asked = body.get("max_completion_tokens", body.get("max_tokens"))
    limit = asked if asked is not None else engine.config.max_tokens_default
    prompt = _prompt_text(body, chat)
    sim = Request(prompt_tokens=max(1, len(prompt.split())), max_tokens=limit, prompt=prompt)
    reply = Reply(engine, sim, chat=chat, stream=bool(body.get("stream")))
    reply.token_ids = bool(body.get("return_token_ids"))
    reason = "abort"
    try:
        await engine.admit(sim)
        if reply.stream:
            await reply.start(request)
        pieces: list[str] = []
        for index in range(limit):
            token = await engine.next_token(sim, index)
            if token is None:
                break
            pieces.append(token if index == 0 else " " + token)
            if reply.stream:
                await reply.send(reply.chunk(pieces[-1], None))
        else:
            reason = "length" if asked is not None else "stop"
        if not reply.stream:
            if reason == "abort":
                return openai_error(400, "The request was aborted.", "BadRequestError")
            return web.json_response(reply.full("".join(pieces), reason))
        await reply.send(reply.chunk("", reason))
        await reply.send_raw(b"data: [DONE]\n\n")
        return reply.started
    except ConnectionResetError:
        return reply.response if reply.response is not None else web.Response(status=503)
    finally:
        await engine.finish(sim, reason)
