"""What a simulated engine generates and what its weights hash to: pure functions of the model,
the prompt and the state of its weights, so that a greedy request is answered the same way
each time, as vLLM answers it, until a wake goes wrong.
"""

from __future__ import annotations

import hashlib

# Deterministic filler text: tests compare outputs.
FILLER = ("lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit")
VOCAB = 151_936
"""Qwen's vocabulary size: token ids fall in [0, VOCAB)."""
LAYER_TENSORS = (
    "input_layernorm.weight",
    "self_attn.qkv_proj.weight",
    "self_attn.o_proj.weight",
    "post_attention_layernorm.weight",
    "mlp.gate_up_proj.weight",
    "mlp.down_proj.weight",
)
"""A Llama-like decoder layer's weights as vLLM's named_parameters() lists them: its attention
and MLP projections fused (qkv_proj, gate_up_proj)."""


def layer_tensors(layer: int) -> list[str]:
    return [f"model.layers.{layer}.{name}" for name in LAYER_TENSORS]


def tensors(layers: int) -> list[str]:
    """Every weight tensor of a model of `layers` layers: 195 for a Llama-3-8B (32 layers), 483
    for a 70B (80)."""
    return [
        "model.embed_tokens.weight",
        *(name for layer in range(layers) for name in layer_tensors(layer)),
        "model.norm.weight",
        "lm_head.weight",
    ]


CORRUPTED = "model.layers.0.mlp.down_proj.weight"
"""The tensor that a wake that restores the wrong weights gets wrong (on rank 0)."""

INTACT, GARBAGE, WRONG_WEIGHTS, ZEROED = ("intact", "garbage", "wrong-weights", "zeroed")
"""The states of an engine's weights: as loaded; discarded by a level-2 sleep and not
reloaded; restored wrong by a wake (one tensor of rank 0: the short greedy answer does not
show it, only the digests do); zeroed by /weight_checker's reset."""
RIGHT, WRONG, NONSENSE = ("right", "wrong", "nonsense")
"""What its answers are: as before; different (weights restored wrong in a way the answers
show, or state beside the weights lost, as the LoRA state of vllm#53888); or garbage (its
weights discarded or zeroed)."""


def _hash(*parts: object) -> bytes:
    return hashlib.sha256("\x00".join(str(p) for p in parts).encode()).digest()


def token_id(model: str, prompt: str, index: int, answers: str, jitter: int = 0) -> int:
    """The token generated at `index` for `prompt`, when its answers are `answers`; `jitter`
    stands for a model whose greedy answers vary between requests (0: none)."""
    salt = "" if answers == RIGHT else answers
    return int.from_bytes(_hash(model, prompt, index, salt, jitter)[:4], "big") % VOCAB


def word(index: int, answers: str) -> str:
    """The text of the token at `index`: the filler, shifted when the answers are off."""
    shift = 0 if answers == RIGHT else 3
    return FILLER[(index + shift) % len(FILLER)]


def checksums(
    model: str, *, layers: int, tensor_parallel: int, pipeline_parallel: int, state: str
) -> dict[str, str]:
    """vLLM's /weight_checker answer (`dp0:pp0:pcp0:tp0:NAME` -> SHA-256), for the weights in
    `state`: each pipeline stage holds consecutive layers (the embedding on the first, the
    final norm and lm_head on the last), each tensor-parallel rank a shard of every tensor of
    its stage, so one digest per tensor per rank."""
    out: dict[str, str] = {}
    for pp in range(pipeline_parallel):
        first, last = layers * pp // pipeline_parallel, layers * (pp + 1) // pipeline_parallel
        names = [name for layer in range(first, last) for name in layer_tensors(layer)]
        if pp == 0:
            names.insert(0, "model.embed_tokens.weight")
        if pp == pipeline_parallel - 1:
            names += ["model.norm.weight", "lm_head.weight"]
        for name in names:
            for tp in range(tensor_parallel):
                key = f"dp0:pp{pp}:pcp0:tp{tp}:{name}"
                out[key] = hashlib.sha256(_tensor_bytes(model, key, name, tp, state)).hexdigest()
    return out


def _tensor_bytes(model: str, key: str, name: str, tp: int, state: str) -> bytes:
    if state == ZEROED:
        return bytes(64)
    wrong = state == GARBAGE or (state == WRONG_WEIGHTS and name == CORRUPTED and tp == 0)
    return _hash(model, key, "wrong" if wrong else "")
