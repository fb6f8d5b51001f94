"""The hybrid-safe wrapper around a vLLM release's own `GPUModelRunner.init_fp8_kv_scales`."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

MARKER = "__snooze_hybrid_kv_fix__"
"""Attribute set on the wrapper, so a second application (and the check) can recognise it."""

_R = TypeVar("_R")


def flatten_kv_caches(entries: Iterable[object]) -> list[object]:
    """Return the tensors of a runner's `kv_caches`, Nones dropped and lists expanded; pure.

    Attention layers hold one tensor per entry; hybrid models (Mamba, DeltaNet) hold a list
    of state tensors per layer; some entries are None.
    """
    flat: list[object] = []
    for entry in entries:
        if entry is None:
            continue
        if isinstance(entry, list):
            flat.extend(item for item in entry if item is not None)
        else:
            flat.append(entry)
    return flat


def is_hybrid_safe(method: object) -> bool:
    """Tell whether `method` is this plugin's wrapper."""
    return getattr(method, MARKER, False) is True


def make_hybrid_safe(original: Callable[..., _R]) -> Callable[..., _R]:
    """Wrap a release's own method so that it only ever sees tensors in `self.kv_caches`.

    Every affected release (0.12.0 to 0.26.x) reads `self.kv_caches` in this method only to
    call `.zero_()` on each non-None entry; everything else in the body (the quantization
    check, which changed in 0.20, the scale reset, `torch.inference_mode`) is the release's
    own code and runs unchanged. The original list is put back even if the body raises,
    because the runner and the attention layers share it.
    """

    @functools.wraps(original)
    def init_fp8_kv_scales(self: Any, *args: Any, **kwargs: Any) -> _R:
        try:
            entries = self.kv_caches
        except AttributeError:
            # The body reads it with getattr(..., []): keep whatever it does without one.
            return original(self, *args, **kwargs)
        self.kv_caches = flatten_kv_caches(entries)
        try:
            return original(self, *args, **kwargs)
        finally:
            self.kv_caches = entries

    setattr(init_fp8_kv_scales, MARKER, True)
    return init_fp8_kv_scales
