"""Benchmark: what wake integrity costs.

1. The weights' digests: vLLM's own `compute_tensor_digests` (read from the 0.33.0 wheel) over
   bfloat16 tensors shaped as Llama-3.1-8B's layers, on this machine's CPU: seconds per GiB,
   and from it the cost per model size (the copy from the GPU is computed at
   --copy-gib-per-second, not measured: there is no GPU here).
2. The output check per wake: two models on simulated engines, the real operator and gateway,
   one with spec.wake.verify and one without, woken in turn by a request through the gateway;
   the time to its first byte of each, and the operator's own timing of the check.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import types
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from harness import ROOT, Bench, bench, free_port, loopback, wait_until
from wake import first_data_seconds

WHEELS = ROOT / ".cache" / "vllm-wheels"
CHECKSUM_SOURCE = "vllm/model_executor/model_loader/weight_checksum.py"
# Llama-3.1-8B: hidden 4096, 8 KV heads of 128, MLP 14336; a layer's weights in bf16.
LAYER_SHAPES = {
    "qkv_proj": (4096 + 2 * 1024, 4096),
    "o_proj": (4096, 4096),
    "gate_up_proj": (2 * 14336, 4096),
    "down_proj": (4096, 14336),
}
MODELS = {"1B": 2.3, "8B": 15.0, "32B": 61.0, "70B": 131.0}
"""bf16 weights in GiB (Llama-3.2-1B, Llama-3.1-8B, Qwen2.5-32B, Llama-3.1-70B)."""
TP_SIZES = (1, 8)
MODELS_SERVED = {"plain": ((77, 3), False), "checked": ((77, 4), True)}


def wheel(version: str) -> Path:
    """The release's wheel, where the image tests keep theirs (tests/image/conftest.py
    downloads them there; so does `pip download --no-deps vllm==VERSION -d .cache/vllm-wheels`)."""
    found = sorted(WHEELS.glob(f"vllm-{version}-*.whl"))
    if not found:
        raise SystemExit(
            f"no vLLM {version} wheel in {WHEELS}: run `pip download --no-deps "
            f"vllm=={version} -d .cache/vllm-wheels` from the repository's root"
        )
    return found[0]


def vllm_digests(version: str) -> Callable[[Any], dict[str, str]]:
    """The release's compute_tensor_digests, loaded from its wheel without the rest of vLLM:
    its one import from vLLM, a parameter class it walks into, is stood in for."""
    import torch

    source = zipfile.ZipFile(wheel(version)).read(CHECKSUM_SOURCE).decode()
    for name in ("vllm", "vllm.model_executor", "vllm.model_executor.parameter"):
        sys.modules.setdefault(name, types.ModuleType(name))

    class SharedWeightParameter(torch.nn.Parameter):  # never instantiated here
        partitions: dict[int, Any]

    sys.modules["vllm.model_executor.parameter"].SharedWeightParameter = SharedWeightParameter  # type: ignore[attr-defined]
    namespace: dict[str, Any] = {}
    exec(compile(source, CHECKSUM_SOURCE, "exec"), namespace)
    function: Callable[[Any], dict[str, str]] = namespace["compute_tensor_digests"]
    return function


def digest_cost(gib: float, version: str) -> dict[str, Any]:
    import torch

    digests = vllm_digests(version)
    model = torch.nn.Module()
    total, layers = 0, 0
    while total < gib * 2**30:
        layer = torch.nn.Module()
        for name, shape in LAYER_SHAPES.items():
            weight = torch.empty(shape, dtype=torch.bfloat16).uniform_(-0.05, 0.05)
            layer.register_parameter(name, torch.nn.Parameter(weight, requires_grad=False))
            total += weight.numel() * weight.element_size()
        model.add_module(f"layer{layers}", layer)
        layers += 1
    began = time.perf_counter()
    found = digests(model)
    seconds = time.perf_counter() - began
    assert len(found) == 4 * layers and all(len(d) == 64 for d in found.values())
    return {"gib": round(total / 2**30, 2), "tensors": len(found), "seconds": round(seconds, 2)}


def asleep(setup: Bench, model: str) -> bool:
    pod = setup.api.get(f"/api/v1/namespaces/default/pods/{model}-0").json()
    return (pod["metadata"].get("labels") or {}).get("snooze.dev/state") == "asleep"


def check_cost(rounds: int, token_seconds: float) -> dict[str, Any]:
    with bench() as setup:
        for model, (place, verify) in MODELS_SERVED.items():
            host = loopback(*place)
            setup.engine(model=model, token_seconds=token_seconds, host=host)
            spec = {"idle": {"after": "1s"}, "wake": {"verify": verify}}
            setup.pod_and_model(model, state=None, spec=spec, host=host)
        metrics = free_port()
        setup.spawn(
            "-m", "snooze.cli", "operator", "--probe-interval", "0.1",
            "--metrics-port", str(metrics),
        )  # fmt: skip
        url = setup.gateway() + "/v1/chat/completions"
        samples: dict[str, list[float]] = {model: [] for model in MODELS_SERVED}
        for _ in range(rounds):
            for model in MODELS_SERVED:
                wait_until(f"{model} asleep", lambda m=model: asleep(setup, m), timeout=60)
                samples[model].append(first_data_seconds(url, model))
        page = httpx.get(f"http://127.0.0.1:{metrics}/metrics").text
    plain, checked = (statistics.median(samples[m]) for m in MODELS_SERVED)
    return {
        "rounds": rounds,
        "token_seconds": token_seconds,
        "first_byte_p50_s": {"verify off": round(plain, 3), "verify on": round(checked, 3)},
        "added_per_wake_ms": round(1000 * (checked - plain), 1),
        "ratio": round(checked / plain, 2),
        "operator_output_check_ms": _mean_ms(page, "output"),
    }


def _mean_ms(page: str, check: str) -> dict[str, float]:
    """The operator's own timing of its checks: mean of records (before a sleep) and checks
    (after a wake) together, from snooze_wake_verification_seconds."""
    sums = counts = 0.0
    for line in page.splitlines():
        if f'check="{check}"' not in line:
            continue
        if line.startswith("snooze_wake_verification_seconds_sum"):
            sums += float(line.rsplit(" ", 1)[1])
        elif line.startswith("snooze_wake_verification_seconds_count"):
            counts += float(line.rsplit(" ", 1)[1])
    return {"mean": round(1000 * sums / counts, 1) if counts else 0.0, "count": counts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=2.0, help="weights to hash (default 2)")
    parser.add_argument("--vllm-version", default="0.33.0")
    parser.add_argument(
        "--copy-gib-per-second",
        type=float,
        default=12.0,
        help="the GPU-to-host copy's speed, for the computed table (default 12: pageable "
        "memory over PCIe 4.0 x16; not measured here)",
    )
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument(
        "--token-seconds", type=float, default=0.02, help="the engines' time per token"
    )
    args = parser.parse_args()
    measured = digest_cost(args.gib, args.vllm_version)
    per_gib = measured["seconds"] / measured["gib"]
    table = {
        size: {
            f"tp{tp}_s": round(gib / tp * (per_gib + 1 / args.copy_gib_per_second), 1)
            for tp in TP_SIZES
        }
        for size, gib in MODELS.items()
    }
    print(
        json.dumps(
            {
                "benchmark": "verify",
                "weights": {
                    "measured": measured,
                    "hash_seconds_per_gib": round(per_gib, 2),
                    "copy_gib_per_second": args.copy_gib_per_second,
                    "per_model_bf16": table,
                },
                "output": check_cost(args.rounds, args.token_seconds),
            }
        )
    )


if __name__ == "__main__":
    main()
