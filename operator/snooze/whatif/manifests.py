"""The plan as manifests to apply: a GPUPool per shared device and an InferenceModel per model
(`spec.pool` for a pool's members), built as plain objects (pure) and written as YAML."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from snooze.api.gpupool import KIND as POOL_KIND
from snooze.api.models import API_VERSION, KIND, InferenceModelSpec
from snooze.whatif.layout import PoolLayout
from snooze.whatif.pooling import Footprint, PoolSettings

NAME_LABEL = "app.kubernetes.io/name"
SGLANG_PORT = 30000
"""`sglang.launch_server`'s default --port."""
GIB = 2**30
MIB = 2**20


def object_name(model: str) -> str:
    """A Kubernetes name (and label value) for a model: its own when it is one, else made
    safe, with a hash of the whole name so that two models never share one."""
    if re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", model):
        return model
    safe = re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-")[:52].strip("-") or "model"
    digest = hashlib.sha256(model.encode()).hexdigest()[:10]
    return f"{safe}-{digest}"


def quantity(size: int) -> str:
    """Bytes as a Kubernetes quantity: Gi or Mi where whole, else bytes."""
    if size % GIB == 0:
        return f"{size // GIB}Gi"
    if size % MIB == 0:
        return f"{size // MIB}Mi"
    return str(size)


def duration(seconds: float) -> str:
    """Seconds as a Kubernetes-style duration (whole seconds, or milliseconds)."""
    if seconds == int(seconds):
        return f"{int(seconds)}s"
    return f"{round(seconds * 1000)}ms"


def pool_manifest(settings: PoolSettings) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "memory": quantity(settings.memory),
        "eviction": settings.eviction.value,
        "minResidency": duration(settings.min_residency),
    }
    if settings.host_memory is not None:
        spec["hostMemory"] = quantity(settings.host_memory)
    if settings.headroom is not None:
        spec["headroom"] = {
            "wakes": settings.headroom.wakes,
            "idleAfter": duration(settings.headroom.idle_after),
        }
    if settings.prime is not None:
        spec["prime"] = {"idleAfter": duration(settings.prime.idle_after)}
    return {
        "apiVersion": API_VERSION,
        "kind": POOL_KIND,
        "metadata": {"name": settings.name},
        "spec": spec,
    }


def model_manifest(
    model: str,
    member: InferenceModelSpec,
    *,
    pool: str | None,
    size: Footprint | None,
    base: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The model's InferenceModel: `base` (the user's own manifest) with its idle policy,
    sleep level, engine kind (where not vLLM) and pool set; without one, a new manifest
    selecting the pods labelled app.kubernetes.io/name with the model's object name."""
    if base is not None:
        manifest = dict(base)
        spec = dict(base.get("spec") or {})
    else:
        name = object_name(model)
        manifest = {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name}}
        spec = {"modelName": model, "selector": {"matchLabels": {NAME_LABEL: name}}}
    spec["idle"] = {**(spec.get("idle") or {}), "after": member.idle.after}
    spec["sleep"] = {**(spec.get("sleep") or {}), "level": member.sleep.level}
    if member.engine.kind != "vllm":
        # SGLang serves on 30000 by default, where the spec's default port is vLLM's 8000.
        engine = {"port": SGLANG_PORT, **(spec.get("engine") or {})}
        spec["engine"] = {**engine, "kind": member.engine.kind}
    spec.pop("pool", None)
    if pool is not None and size is not None:
        spec["pool"] = {
            "name": pool,
            "memory": quantity(size.memory),
            "asleepMemory": quantity(size.asleep),
        }
    manifest["spec"] = spec
    return manifest


def build(
    pools: Sequence[PoolLayout],
    alone: Sequence[str],
    member: InferenceModelSpec,
    *,
    sizes: Mapping[str, Footprint],
    bases: Mapping[str, Mapping[str, Any]],
) -> dict[str, list[dict[str, Any]]]:
    """The documents of each file to write: one per pool (its GPUPool, then its members'
    InferenceModels) and one for the models on devices of their own."""
    files: dict[str, list[dict[str, Any]]] = {}
    for layout in pools:
        name = layout.settings.name
        docs = [pool_manifest(layout.settings)]
        docs += [
            model_manifest(m, member, pool=name, size=sizes[m], base=bases.get(m))
            for m in layout.members
        ]
        files[f"{name}.yaml"] = docs
    if alone:
        files["alone.yaml"] = [
            model_manifest(m, member, pool=None, size=None, base=bases.get(m)) for m in alone
        ]
    return files


def write(folder: Path, files: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, docs in files.items():
        path = folder / name
        path.write_text(yaml.safe_dump_all(docs, sort_keys=False), encoding="utf-8")
        written.append(path)
    return written
