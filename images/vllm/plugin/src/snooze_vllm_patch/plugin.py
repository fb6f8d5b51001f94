"""The `vllm.general_plugins` entry point: puts the hybrid-safe `init_fp8_kv_scales` in place."""

from __future__ import annotations

import importlib
import logging
import sys
from types import ModuleType

from snooze_vllm_patch.fix import is_hybrid_safe, make_hybrid_safe
from snooze_vllm_patch.hook import when_imported
from snooze_vllm_patch.versions import Verdict, classify

logger = logging.getLogger("snooze_vllm_patch")

TARGET_MODULE = "vllm.v1.worker.gpu_model_runner"
TARGET_CLASS = "GPUModelRunner"
TARGET_METHOD = "init_fp8_kv_scales"
TARGET = f"{TARGET_CLASS}.{TARGET_METHOD}"


def register() -> None:
    """Patch vLLM in this process if its release is affected; never raises.

    vLLM calls this once per process (API server, engine core, each worker) before the model
    runner is built. The runner's module is heavy (CUDA kernels, model layers), so it is
    patched right after it is imported rather than imported here: processes that never
    build a runner pay nothing.
    """
    try:
        _make_visible(logger)
        # The caller is vLLM, so this is already loaded.
        vllm = importlib.import_module("vllm")
        version = str(getattr(vllm, "__version__", ""))
        verdict = classify(version)
        if verdict is not Verdict.AFFECTED:
            logger.info(
                "vLLM %s is %s for issue #41564: %s left alone",
                version or "(no version)",
                verdict.value,
                TARGET,
            )
            return
        if not when_imported(TARGET_MODULE, lambda module: patch_module(module, version)):
            logger.debug("%s will be patched when %s is imported", TARGET, TARGET_MODULE)
    except Exception:
        # vLLM calls plugin functions unguarded: raising here would stop it from starting.
        logger.exception("could not apply the hybrid KV cache fix; vLLM runs unpatched")


def patch_module(module: ModuleType, version: str) -> bool:
    """Replace the method in the runner's module; True if this call replaced it, never raises.

    Idempotent: a method that is already the wrapper is left as it is.
    """
    try:
        runner = getattr(module, TARGET_CLASS, None)
        original = getattr(runner, TARGET_METHOD, None)
        if runner is None or original is None:
            logger.info("vLLM %s has no %s: left alone", version, TARGET)
            return False
        if is_hybrid_safe(original):
            logger.debug("%s is already patched", TARGET)
            return False
        setattr(runner, TARGET_METHOD, make_hybrid_safe(original))
        logger.info(
            "patched %s for hybrid KV caches (vLLM %s, issue #41564): "
            "None entries skipped, list entries zeroed tensor by tensor",
            TARGET,
            version,
        )
        return True
    except Exception:
        logger.exception("could not patch %s; vLLM runs unpatched", TARGET)
        return False


def _make_visible(log: logging.Logger) -> None:
    """Give the logger a stderr handler when nothing else would print its INFO line.

    vLLM configures only its own `vllm` logger; without this the one line saying what the
    plugin did would fall to Python's last-resort handler, which drops INFO.
    """
    if log.hasHandlers():
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [%(name)s] %(message)s"))
    log.addHandler(handler)
    if log.level == logging.NOTSET:
        log.setLevel(logging.INFO)
    # A root handler configured later would otherwise print every line twice.
    log.propagate = False
