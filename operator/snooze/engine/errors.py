"""The errors the engine client raises, and the pure rules that classify an engine's answer."""

from __future__ import annotations

import json
import re
from typing import Any

from snooze.api.reasons import FailureReason

# What vLLM 0.12.0 to 0.26.0 says when a hybrid model with a quantized KV cache wakes up
# (vLLM issue #41564): `init_fp8_kv_scales` calls `.zero_()` on a list of state tensors.
HYBRID_SIGNATURES = ("'list' object has no attribute 'zero_'", "init_fp8_kv_scales")
# What vLLM answers when a wake-up cannot map its memory back (CuMemAllocator's cuMemCreate:
# another engine holds the device memory): "CUDA Error: out of memory at <path>:163".
OUT_OF_MEMORY_SIGNATURES = ("cuda error: out of memory", "cuda out of memory")
# The assertion vLLM raises when /sleep reaches an engine started without --enable-sleep-mode.
_SLEEP_MODE_OFF_SIGNATURE = "sleep mode is not enabled"
# Long enough for a Python exception line, short enough for a Kubernetes condition message.
MESSAGE_LIMIT = 300

_HOW_TO_ENABLE = (
    "start vLLM with --enable-sleep-mode and the environment variable VLLM_SERVER_DEV_MODE=1 "
    "(and keep its port private: DEV_MODE also opens admin routes)"
)


class EngineError(Exception):
    """An engine did not do what the client asked. The tree, by `reason`:

    - `EngineError`: the base class; `reason` is also the metrics label and the condition
      reason the operator records (`snooze_wake_failures_total{reason}`, `WakeFailed`).
    - `EngineUnreachableError` ("Unreachable"): no connection (refused, reset, DNS, connect
      timeout) or the connection broke mid-answer. The pod is gone, starting or dead.
    - `EngineTimeoutError` ("Timeout"): connected, but no answer in time. A wake or a sleep
      that times out may still be running inside the engine: ask `is_sleeping` before retrying.
    - `EngineHTTPError` ("EngineError"): a non-2xx answer; carries `status` and the engine's
      own `message`. Its subclasses:
      - `AnswerTooLargeError` ("AnswerTooLarge"): an answer longer than the client reads of
        one (engine/http.py); nothing of it is believed.
      - `InvalidAnswerError` ("InvalidAnswer"): a 2xx answer the client cannot read, or one
        with a value no engine can have (NaN, an infinity, a negative count, a series sent
        twice); nothing of it is believed.
      - `HybridKVCacheReinitError` ("HybridKVCacheReinit"): the vLLM hybrid-model wake bug;
        the engine stays asleep until its pod restarts.
      - `SleepModeDisabledError` ("SleepModeDisabled"): the engine does not offer sleep mode.
      - `OutOfMemoryError` ("OutOfMemory"): a wake found the device's memory taken (another
        engine on a shared GPU); the engine stays asleep until room is made.

    `url` names the engine and endpoint; `str(error)` says what went wrong and what to do.
    """

    reason: str = FailureReason.ENGINE_ERROR

    def __init__(self, message: str, *, url: str) -> None:
        super().__init__(message)
        self.url = url


class EngineUnreachableError(EngineError):
    """No connection to the engine, or the connection broke before a whole answer."""

    reason = FailureReason.UNREACHABLE


class EngineTimeoutError(EngineError):
    """The engine accepted the connection but did not answer within the timeout."""

    reason = FailureReason.TIMEOUT


class EngineHTTPError(EngineError):
    """The engine answered with an error status, or with a body the client cannot read."""

    reason = FailureReason.ENGINE_ERROR

    def __init__(self, text: str, *, url: str, status: int, message: str) -> None:
        super().__init__(text, url=url)
        self.status = status
        self.message = message


class AnswerTooLargeError(EngineHTTPError):
    """The engine's answer was longer than the most the client reads of one."""

    reason = FailureReason.ANSWER_TOO_LARGE


class InvalidAnswerError(EngineHTTPError):
    """The engine answered 2xx with something the client cannot read or cannot believe."""

    reason = FailureReason.INVALID_ANSWER


class HybridKVCacheReinitError(EngineHTTPError):
    """The wake-up crashed re-initialising a hybrid model's quantized KV cache (vLLM #41564)."""

    reason = FailureReason.HYBRID_KV_CACHE_REINIT


class OutOfMemoryError(EngineHTTPError):
    """A wake-up could not allocate device memory: something else holds it."""

    reason = FailureReason.OUT_OF_MEMORY


class SleepModeDisabledError(EngineHTTPError):
    """The engine has no sleep endpoints, or was started without sleep mode."""

    reason = FailureReason.SLEEP_MODE_DISABLED


def error_message(body: str) -> str:
    """Return the human message inside an error body, shortened to `MESSAGE_LIMIT` characters.

    Pure. Reads OpenAI-style `{"error": {"message": ...}}` (vLLM 0.10.1+), the flat
    `{"message": ...}` of older vLLM, FastAPI's `{"detail": ...}`, or falls back to the text.
    """
    text = body.strip()
    try:
        data: Any = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        inner = data.get("error")
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            text = inner["message"]
        elif isinstance(inner, str):
            text = inner
        elif isinstance(data.get("message"), str):
            text = data["message"]
        elif isinstance(data.get("detail"), str):
            text = data["detail"]
    text = re.sub(r"\s+", " ", text).strip()
    if len(text) > MESSAGE_LIMIT:
        text = text[: MESSAGE_LIMIT - 1].rstrip() + "…"
    return text or "(empty body)"


def classify_answer(status: int, body: str, *, url: str, path: str) -> EngineHTTPError:
    """Return the error that an engine's non-2xx answer to `path` stands for.

    Pure: `status` and `body` in, an exception instance out (not raised). The whole body is
    searched for the signatures, not only the shortened message, so that a long traceback
    still classifies.
    """
    message = error_message(body)
    lowered = body.lower()
    if any(signature.lower() in lowered for signature in HYBRID_SIGNATURES):
        return HybridKVCacheReinitError(
            f"{url} crashed waking up: {message!r}. This is vLLM's hybrid-model KV cache "
            "re-initialisation bug (issue #41564, vLLM 0.12.0 to 0.26.0): the engine stays "
            "asleep and requests to it hang. Restart the pod, and run the patched image "
            "(images/vllm) or vLLM 0.27.0 or later.",
            url=url,
            status=status,
            message=message,
        )
    if any(signature in lowered for signature in OUT_OF_MEMORY_SIGNATURES):
        return OutOfMemoryError(
            f"{url} ran out of device memory waking up: {message!r}. Another engine on the "
            "same GPU holds it: put it in the same GPUPool as this one (spec.pool), or lower "
            "the engines' --gpu-memory-utilization so that they fit together.",
            url=url,
            status=status,
            message=message,
        )
    if status == 404 and not path.startswith("/metrics") and path != "/health":
        how = (
            "vLLM serves it from 0.10.2 (in dev mode), and a level-2 wake needs it to reload "
            "the weights: upgrade vLLM, or sleep at level 1"
            if path == "/collective_rpc"
            else f"To use sleep mode, {_HOW_TO_ENABLE}"
        )
        return SleepModeDisabledError(
            f"{url} answered 404: the engine does not offer {path}. {how}.",
            url=url,
            status=status,
            message=message,
        )
    if _SLEEP_MODE_OFF_SIGNATURE in lowered:
        return SleepModeDisabledError(
            f"{url} answered {status}: {message!r}. The engine runs without sleep mode: "
            f"{_HOW_TO_ENABLE}.",
            url=url,
            status=status,
            message=message,
        )
    hint = ""
    if status >= 500 and path == "/wake_up":
        # vLLM 0.12 to 0.17 answer the hybrid crash with a bare "Internal Server Error".
        hint = (
            " If the model is hybrid (Mamba, DeltaNet) with a quantized KV cache, this may be "
            "vLLM's hybrid wake bug (#41564): read the engine's log, restart the pod, and run "
            "images/vllm or vLLM 0.27.0 or later."
        )
    elif status >= 500:
        hint = " Read the engine's log; if it keeps failing, restart the pod."
    return EngineHTTPError(
        f"{url} answered {status}: {message!r}.{hint}",
        url=url,
        status=status,
        message=message,
    )
