"""The plugin against the real `init_fp8_kv_scales` of vLLM releases, compiled from their wheels."""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

import pytest
import torch

from snooze_vllm_patch.fix import make_hybrid_safe
from snooze_vllm_patch.versions import Verdict, classify

pytestmark = pytest.mark.vllm_wheels

# The first and the last affected release; their bodies differ in the quantization check
# (0.12-0.19: cache_dtype.startswith("fp8"); 0.20-0.26: is_quantized_kv_cache()).
AFFECTED = ("0.12.0", "0.26.0")
FIXED = "0.27.0"


class Attention:
    def __init__(self) -> None:
        self._k_scale = torch.zeros(1)
        self._v_scale = torch.zeros(1)
        self.k_scale = torch.zeros(1)
        self.v_scale = torch.zeros(1)


class MLAAttention(Attention):
    pass


class OtherLayer:
    """Not an attention layer in vLLM's eyes (a Mamba mixer): its scales stay as they are."""

    def __init__(self) -> None:
        self._k_scale = torch.zeros(1)


class Config:
    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)


def make_runner(method: Callable[..., None], cache_dtype: str, kv_caches: list[Any]) -> Any:
    """A fake runner with the attributes the real bodies read."""
    layers = {"attn": Attention(), "mla": MLAAttention(), "mamba": OtherLayer()}
    cls = type("GPUModelRunner", (), {"init_fp8_kv_scales": method})
    runner = cls()
    runner.cache_config = Config(cache_dtype=cache_dtype)
    runner.compilation_config = Config(static_forward_context=layers)
    runner.kv_caches = kv_caches
    return runner


def hybrid_caches() -> tuple[list[Any], list[torch.Tensor]]:
    """KV caches as a hybrid model has them: tensors, a None, a list of state tensors."""
    attn, conv, ssm, other = torch.ones(2, 4), torch.ones(3), torch.ones(2, 2), torch.ones(5)
    return [attn, None, [conv, ssm], other], [attn, conv, ssm, other]


def real(upstream: Callable[[str], Any], version: str) -> Callable[..., None]:
    method: Callable[..., None] = upstream(version).compile(
        Attention=Attention, MLAAttention=MLAAttention
    )
    return method


@pytest.mark.parametrize("version", AFFECTED)
def test_the_target_exists_with_the_expected_signature(upstream: Any, version: str) -> None:
    node = upstream(version).node
    assert node is not None
    assert [arg.arg for arg in node.args.args] == ["self"]
    assert not (node.args.vararg or node.args.kwarg or node.args.kwonlyargs)
    assert [ast.unparse(d) for d in node.decorator_list] == ["torch.inference_mode()"]
    assert classify(version) is Verdict.AFFECTED


@pytest.mark.parametrize("version", AFFECTED)
def test_the_body_only_iterates_kv_caches_to_zero_them(upstream: Any, version: str) -> None:
    """The premise of the wrapper: a flat list of tensors changes nothing else in the body."""
    node = upstream(version).node
    uses = [
        sub
        for sub in ast.walk(node)
        if (isinstance(sub, ast.Name) and sub.id == "kv_caches")
        or (isinstance(sub, ast.Attribute) and sub.attr == "kv_caches")
        or (isinstance(sub, ast.Constant) and sub.value == "kv_caches")
    ]
    # `kv_caches = getattr(self, "kv_caches", [])` and `for entry in kv_caches:`, nothing else.
    assert sorted(type(use).__name__ for use in uses) == ["Constant", "Name", "Name"]
    assert "kv_caches = getattr(self, 'kv_caches', [])" in ast.unparse(node)
    (loop,) = [
        sub
        for sub in ast.walk(node)
        if isinstance(sub, ast.For) and ast.unparse(sub.iter) == "kv_caches"
    ]
    entry = ast.unparse(loop.target)
    uses_of_entry = [
        ast.unparse(parent)
        for parent in ast.walk(loop)
        for child in ast.iter_child_nodes(parent)
        if isinstance(child, ast.Name) and child.id == entry and parent is not loop
    ]
    assert sorted(uses_of_entry) == [f"{entry} is not None", f"{entry}.zero_"]


@pytest.mark.parametrize("version", AFFECTED)
def test_the_unpatched_method_crashes_on_a_list_entry(upstream: Any, version: str) -> None:
    entries, _ = hybrid_caches()
    runner = make_runner(real(upstream, version), "fp8", entries)
    with pytest.raises(AttributeError, match="'list' object has no attribute 'zero_'"):
        runner.init_fp8_kv_scales()


@pytest.mark.parametrize("version", AFFECTED)
def test_the_patched_method_zeroes_every_tensor_and_resets_scales(
    upstream: Any, version: str
) -> None:
    entries, tensors = hybrid_caches()
    runner = make_runner(make_hybrid_safe(real(upstream, version)), "fp8_e4m3", entries)
    runner.init_fp8_kv_scales()
    assert all(torch.count_nonzero(t) == 0 for t in tensors)
    assert runner.kv_caches is entries
    assert entries[1] is None and isinstance(entries[2], list)
    layers = runner.compilation_config.static_forward_context
    for name in ("attn", "mla"):
        for attr in ("_k_scale", "_v_scale", "k_scale", "v_scale"):
            assert getattr(layers[name], attr).item() == 1.0, (name, attr)
    assert layers["mamba"]._k_scale.item() == 0.0


@pytest.mark.parametrize("version", AFFECTED)
def test_the_patched_method_leaves_an_unquantized_cache_alone(upstream: Any, version: str) -> None:
    entries, tensors = hybrid_caches()
    runner = make_runner(make_hybrid_safe(real(upstream, version)), "auto", entries)
    runner.init_fp8_kv_scales()
    assert all(bool(torch.all(t == 1)) for t in tensors)
    assert runner.compilation_config.static_forward_context["attn"]._k_scale.item() == 0.0


@pytest.mark.parametrize(("version", "zeroed"), [("0.12.0", False), ("0.26.0", True)])
def test_each_release_keeps_its_own_quantization_check(
    upstream: Any, version: str, zeroed: bool
) -> None:
    """nvfp4 counts as quantized from 0.20 only; the patch must not change that."""
    entries, tensors = hybrid_caches()
    runner = make_runner(make_hybrid_safe(real(upstream, version)), "nvfp4", entries)
    runner.init_fp8_kv_scales()
    assert all(bool(torch.all(t == 0)) is zeroed for t in tensors)


def test_the_fixed_release_handles_lists_itself(upstream: Any) -> None:
    """0.27.0 needs no patch, which is why the plugin leaves it alone."""
    assert classify(FIXED) is Verdict.FIXED
    entries, tensors = hybrid_caches()
    runner = make_runner(real(upstream, FIXED), "fp8", entries)
    runner.init_fp8_kv_scales()
    assert all(torch.count_nonzero(t) == 0 for t in tensors)
