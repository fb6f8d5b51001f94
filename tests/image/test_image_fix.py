"""The plugin without vLLM: which versions are affected, the flattening, the wrapper, safety."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from snooze_vllm_patch.fix import flatten_kv_caches, is_hybrid_safe, make_hybrid_safe
from snooze_vllm_patch.versions import Verdict, classify, release_of

PLUGIN_SRC = Path(__file__).resolve().parents[2] / "images" / "vllm" / "plugin" / "src"


@pytest.mark.parametrize(
    ("version", "verdict"),
    [
        ("0.11.2", Verdict.BEFORE),
        ("0.12.0", Verdict.AFFECTED),
        ("0.19.1", Verdict.AFFECTED),
        ("0.20.0", Verdict.AFFECTED),
        ("0.26.0", Verdict.AFFECTED),
        ("0.26.0+cu129", Verdict.AFFECTED),
        ("0.26.1.dev12+gabcdef", Verdict.AFFECTED),
        ("0.27.0rc1", Verdict.FIXED),
        ("0.27.0", Verdict.FIXED),
        ("0.29.0", Verdict.FIXED),
        ("1.0", Verdict.FIXED),
        ("dev", Verdict.UNKNOWN),
        ("", Verdict.UNKNOWN),
    ],
)
def test_classify(version: str, verdict: Verdict) -> None:
    assert classify(version) is verdict


def test_release_of_pads_a_missing_patch_number() -> None:
    assert release_of("v0.26") == (0, 26, 0)


A, B, C = object(), object(), object()


@pytest.mark.parametrize(
    ("entries", "flat"),
    [
        ([], []),
        ([A, B], [A, B]),
        ([A, None, B], [A, B]),
        ([[A, B], C], [A, B, C]),
        ([None, [A, None], [], B], [A, B]),
    ],
)
def test_flatten_kv_caches(entries: list[Any], flat: list[Any]) -> None:
    assert flatten_kv_caches(entries) == flat


class Runner:
    def __init__(self, kv_caches: list[Any]) -> None:
        self.kv_caches = kv_caches


def test_wrapper_shows_the_body_tensors_only_and_restores_the_list() -> None:
    seen: list[list[Any]] = []

    def body(self: Runner) -> None:
        seen.append(list(self.kv_caches))

    runner = Runner([A, None, [B, C]])
    entries = runner.kv_caches
    make_hybrid_safe(body)(runner)
    assert seen == [[A, B, C]]
    # The runner and the attention layers share this list: same object, same entries.
    assert runner.kv_caches is entries
    assert entries == [A, None, [B, C]]


def test_wrapper_restores_the_list_when_the_body_raises() -> None:
    def body(self: Runner) -> None:
        raise RuntimeError("boom")

    runner = Runner([[A]])
    entries = runner.kv_caches
    with pytest.raises(RuntimeError, match="boom"):
        make_hybrid_safe(body)(runner)
    assert runner.kv_caches is entries


def test_wrapper_passes_through_a_runner_without_kv_caches() -> None:
    calls: list[object] = []

    def body(self: object) -> str:
        calls.append(self)
        return "done"

    runner = object()
    assert make_hybrid_safe(body)(runner) == "done"
    assert calls == [runner]


def test_wrapper_is_recognisable_and_keeps_the_original() -> None:
    def init_fp8_kv_scales(self: Runner) -> None:
        """Original docstring."""

    wrapped = make_hybrid_safe(init_fp8_kv_scales)
    assert is_hybrid_safe(wrapped)
    assert not is_hybrid_safe(init_fp8_kv_scales)
    assert wrapped.__wrapped__ is init_fp8_kv_scales  # type: ignore[attr-defined]
    assert wrapped.__name__ == "init_fp8_kv_scales"
    assert wrapped.__doc__ == "Original docstring."


def test_wrapper_zeroes_real_tensors_through_a_zeroing_body() -> None:
    def body(self: Runner) -> None:
        for tensor in self.kv_caches:
            tensor.zero_()

    tensor, state_a, state_b = torch.ones(4), torch.ones(2, 2), torch.ones(3)
    make_hybrid_safe(body)(Runner([tensor, None, [state_a, state_b]]))
    for t in (tensor, state_a, state_b):
        assert torch.count_nonzero(t) == 0


def test_register_never_breaks_startup(python: Any, tmp_path: Path) -> None:
    """No vLLM at all, the worst case: the error is logged and register() returns."""
    script = "from snooze_vllm_patch import plugin\nplugin.register()\nprint('started')\n"
    done = python(script, path=[tmp_path, PLUGIN_SRC])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "started"
    assert "ERROR" in done.stderr and "vLLM runs unpatched" in done.stderr
