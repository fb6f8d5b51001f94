"""The requests that check a woken engine: a fixed greedy generation, vLLM's own weight
checksums (`/weight_checker`, 0.32+) and the engine's release (`/version`).

Every function raises only EngineError subclasses; what an answer means is decided elsewhere
(operator/model/verification.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from snooze.api.reasons import FailureReason
from snooze.engine.errors import EngineHTTPError, EngineTimeoutError, error_message
from snooze.engine.http import ANSWER_LIMIT, Answer, EngineHttp

# A `timeout` argument, not the caller's asyncio.timeout: it counts from the request's turn in
# the shared session (EngineHttp), as the engine client's own (engine/client.py).

# A prompt any model continues, and a handful of tokens: one short prefill and a few decode
# steps, each a whole forward pass through every weight (benchmarks/verify.py: a token's time
# each, added to every wake).
PROMPT = "Snooze wake check. Count from one to ten: one, two, three,"
MAX_TOKENS = 4
SEED = 0
COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
# Bounds on what an engine's answer may hold before it is not believed (a hostile engine can
# send anything): token ids per answer, and weight tensors over all ranks. vLLM answers one
# digest per tensor per rank: a Llama-3-8B has 195 tensors, 780 at tensor parallel 4; a 70B
# at tensor parallel 8, 3,864; a mixture of experts keeps each layer's experts in a few fused
# tensors, so even the largest at 32 ranks stay well under this.
MAX_TOKEN_IDS = 64
MAX_TENSORS = 65_536
DIGEST_LENGTH = 64
# What one tensor's entry takes in vLLM's compact JSON, at most: its name
# (`dp0:pp0:pcp0:tp0:model.layers.79.post_attention_layernorm.weight`, about 65 characters;
# 100 allowed beyond the rank prefix), its SHA-256 (64) and the quotes, colon and comma.
MAX_ENTRY_BYTES = 192
CHECKSUMS_LIMIT = MAX_TENSORS * MAX_ENTRY_BYTES
"""The most read of a /weight_checker answer (12 MiB); the answer's own Content-Length, which
vLLM's JSONResponse sends, refuses a larger one before a byte of it is read. A real answer is
about 129 bytes a tensor and rank: 98 kB for an 8B model at tensor parallel 4, 490 kB for a
70B at 8 (the simulator's, sized as theirs, are tested against this)."""
PARSED_ON_THE_LOOP = ANSWER_LIMIT
"""Answers longer than this are parsed in a worker thread: 490 kB of JSON and the checks of
its thousands of entries would hold the operator's event loop for milliseconds."""


@dataclass(frozen=True)
class Greedy:
    """An engine's answer to the fixed greedy request."""

    route: str
    """The route that answered: /v1/completions, or the chat route for a model without it."""
    tokens: tuple[int, ...] | None
    """The generated token ids (vLLM 0.10.2+ returns them); None when the engine did not."""
    text: str


class NoGenerationRoute(EngineHTTPError):
    """Neither /v1/completions nor the chat route answers: the model does not generate text
    (a pooling model), so there is no answer to compare."""

    reason = FailureReason.NO_GENERATION_ROUTE


def greedy_body(model: str, route: str) -> dict[str, Any]:
    """The request, at temperature 0 with a seed: vLLM answers it with the same tokens each
    time its weights and state are the same."""
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "seed": SEED,
        "n": 1,
        "stream": False,
        "return_token_ids": True,
    }
    if route == CHAT:
        body["messages"] = [{"role": "user", "content": PROMPT}]
    else:
        body["prompt"] = PROMPT
    return body


async def greedy(
    http: EngineHttp,
    base_url: str,
    model: str,
    *,
    route: str | None,
    timeout: float,  # noqa: ASYNC109
) -> Greedy:
    """Send the greedy request: to `route` if the engine answered on it before, else to
    /v1/completions and, where that route is missing, to the chat route."""
    routes = [route] if route else [COMPLETIONS, CHAT]
    for path in routes:
        answer = await _send(http, "POST", base_url, path, timeout, greedy_body(model, path))
        if answer.status == 404 and _route_missing(answer) and path != routes[-1]:
            continue
        if answer.status == 404 and _route_missing(answer):
            raise NoGenerationRoute(
                f"{base_url} has no {COMPLETIONS} or {CHAT} route: the model does not "
                "generate text, so its answers after a wake cannot be checked",
                url=base_url + path,
                status=404,
                message="no generation route",
            )
        if not answer.is_success:
            raise _failed(answer, base_url, path)
        return _read_greedy(answer, base_url, path)
    raise AssertionError("unreachable: routes is never empty")


def _route_missing(answer: Answer) -> bool:
    """FastAPI's own 404 (no such route: `{"detail": "Not Found"}` in every release), not
    vLLM's own (no such model), which is an error: `{"error": {...}}` from 0.10.1, a flat
    `{"object": "error", ...}` before."""
    try:
        data = json.loads(answer.body)
    except ValueError:
        return True
    return not (isinstance(data, dict) and ("error" in data or data.get("object") == "error"))


def _read_greedy(answer: Answer, base_url: str, path: str) -> Greedy:
    data = _object(answer, base_url, path)
    choices = data.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else None
    if not isinstance(choice, dict):
        raise _unreadable(base_url, path, "no choices")
    if path == CHAT:
        message = choice.get("message")
        text = message.get("content") if isinstance(message, dict) else None
    else:
        text = choice.get("text")
    ids = choice.get("token_ids")
    tokens: tuple[int, ...] | None = None
    if isinstance(ids, list):
        if len(ids) > MAX_TOKEN_IDS or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in ids
        ):
            raise _unreadable(base_url, path, "token_ids is not a short list of integers")
        tokens = tuple(ids)
    return Greedy(route=path, tokens=tokens, text=str(text or ""))


async def weight_checksums(
    http: EngineHttp,
    base_url: str,
    *,
    timeout: float,  # noqa: ASYNC109
) -> dict[str, str] | None:
    """vLLM's digest of every weight tensor on every rank (`{"action": "checksum"}`); None
    when the release has no /weight_checker (before 0.32.0, or without dev mode). Never the
    `reset` action, which zeroes the weights."""
    path = "/weight_checker"
    body = {"action": "checksum"}
    answer = await _send(http, "POST", base_url, path, timeout, body, limit=CHECKSUMS_LIMIT)
    if answer.status == 404 and _route_missing(answer):
        return None
    if not answer.is_success:
        raise _failed(answer, base_url, path)
    if len(answer.body) <= PARSED_ON_THE_LOOP:
        found = _checksums(answer.body)
    else:
        found = await asyncio.to_thread(_checksums, answer.body)
    if isinstance(found, str):
        raise _unreadable(base_url, path, found)
    return found


def _checksums(body: bytes) -> dict[str, str] | str:
    """Pure: the checksums in a /weight_checker answer, or what is wrong with it."""
    try:
        data = json.loads(body)
    except ValueError:
        return "not JSON"
    checksums = data.get("checksums") if isinstance(data, dict) else None
    if not isinstance(checksums, dict) or len(checksums) > MAX_TENSORS:
        return "no checksums object"
    if not all(isinstance(v, str) and len(v) <= DIGEST_LENGTH * 2 for v in checksums.values()):
        return "a checksum that is not a digest"
    return {str(k): str(v) for k, v in checksums.items()}


def digest(checksums: Mapping[str, str]) -> str:
    """One SHA-256 over every tensor's name and digest, in name order: what the status keeps
    (the whole map of a large model does not fit on it)."""
    hashed = hashlib.sha256()
    for name in sorted(checksums):
        hashed.update(f"{name}={checksums[name]}\n".encode())
    return hashed.hexdigest()


async def version(http: EngineHttp, base_url: str, *, timeout: float) -> str:  # noqa: ASYNC109
    """The engine's vLLM release, from its /version (`{"version": "0.33.0"}`)."""
    path = "/version"
    answer = await _send(http, "GET", base_url, path, timeout, None)
    if not answer.is_success:
        raise _failed(answer, base_url, path)
    found = _object(answer, base_url, path).get("version")
    if not isinstance(found, str) or not found or len(found) > 64:
        raise _unreadable(base_url, path, "no version string")
    return found


async def _send(
    http: EngineHttp,
    method: str,
    base_url: str,
    path: str,
    timeout: float,  # noqa: ASYNC109
    body: Any,
    *,
    limit: int = ANSWER_LIMIT,
) -> Answer:
    try:
        return await http.request(
            method,
            base_url + path,
            total=timeout,
            connect=min(timeout, 5.0),
            json=body,
            limit=limit,
        )
    except TimeoutError as error:
        raise EngineTimeoutError(
            f"{base_url} took longer than {timeout:g}s answering {path}.", url=base_url + path
        ) from error


def _object(answer: Answer, base_url: str, path: str) -> dict[str, Any]:
    try:
        data = json.loads(answer.body)
    except ValueError as error:
        raise _unreadable(base_url, path, "not JSON") from error
    if not isinstance(data, dict):
        raise _unreadable(base_url, path, "not a JSON object")
    return data


def _failed(answer: Answer, base_url: str, path: str) -> EngineHTTPError:
    message = error_message(answer.text)
    return EngineHTTPError(
        f"{base_url}{path} answered {answer.status}: {message!r}.",
        url=base_url + path,
        status=answer.status,
        message=message,
    )


def _unreadable(base_url: str, path: str, what: str) -> EngineHTTPError:
    return EngineHTTPError(
        f"{base_url}{path} answered something the operator cannot read ({what}).",
        url=base_url + path,
        status=200,
        message=what,
    )
