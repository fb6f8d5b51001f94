"""Which models of a trace share a GPU in a whatif replay: GPUPools and their members, read from
the GPUPool and InferenceModel manifests a user applies, or from the command line (a device's
memory, each model's awake and asleep memory); every model not in a pool has devices of its own."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from snooze.api.gpupool import KIND as POOL_KIND
from snooze.api.gpupool import Eviction, parse_pool_spec
from snooze.api.models import (
    DNS_LABEL,
    KIND,
    InferenceModelSpec,
    SpecError,
    describe_validation_error,
)
from snooze.api.quantities import QuantityError, format_gib, parse_quantity
from snooze.policy.pool.decision import Headroom, Prime
from snooze.whatif.pooling import Footprint, PoolSettings

ASLEEP_DEFAULT = "1Gi"
"""What a sleeping engine still holds when no one says (the CRD's default)."""


class LayoutError(ValueError):
    """Pools that cannot be replayed; the message names the file or flag and the fix."""


@dataclass(frozen=True, kw_only=True)
class PoolLayout:
    settings: PoolSettings
    members: dict[str, Footprint]
    """By the trace's model name, in the order given."""


@dataclass(frozen=True, kw_only=True)
class Layout:
    pools: list[PoolLayout] = field(default_factory=list)
    specs: dict[str, InferenceModelSpec] = field(default_factory=dict)
    """The InferenceModels the manifests declared, by the trace's model name (for the
    `declared` policy)."""

    def pool_of(self, model: str) -> PoolLayout | None:
        return next((p for p in self.pools if model in p.members), None)

    def check(self) -> None:
        """Refuse a pool where a member cannot wake even with every other member asleep."""
        for pool in self.pools:
            for name, size in pool.members.items():
                others = sum(f.asleep for m, f in pool.members.items() if m != name)
                if size.memory + others > pool.settings.memory:
                    raise LayoutError(
                        f"GPUPool {pool.settings.name}: {name} takes {format_gib(size.memory)} "
                        f"awake and the others {format_gib(others)} asleep, more than its "
                        f"{format_gib(pool.settings.memory)}: give the pool more memory or "
                        "fewer members"
                    )


def from_manifests(paths: Sequence[Path]) -> Layout:
    """Pools from GPUPool and InferenceModel documents (files, or folders of .yaml files):
    an InferenceModel with spec.pool joins the GPUPool it names, in its namespace, as the
    trace's model of its spec.modelName (default: its name)."""
    return from_documents(_documents(paths))


def from_documents(documents: Iterable[tuple[str, Mapping[str, Any]]]) -> Layout:
    """Pools from manifests already read: (where each came from, the document)."""
    pools: dict[tuple[str, str], PoolSettings] = {}
    joins: list[tuple[str, str, tuple[str, str], Footprint]] = []
    specs: dict[str, InferenceModelSpec] = {}
    for where, doc in documents:
        kind = doc.get("kind")
        meta = doc.get("metadata") or {}
        name = str(meta.get("name") or "")
        namespace = str(meta.get("namespace") or "default")
        if kind == POOL_KIND:
            pools[(namespace, name)] = _pool(where, name, doc.get("spec") or {})
        elif kind == KIND:
            model, spec = _model(where, name, doc.get("spec") or {})
            if model in specs:
                raise LayoutError(f"{where}: a second InferenceModel for model {model!r}")
            specs[model] = spec
            if spec.pool is not None:
                joins.append((where, model, (namespace, spec.pool.name), _footprint(where, spec)))
    members: dict[tuple[str, str], dict[str, Footprint]] = {}
    for where, model, key, size in joins:
        if key not in pools:
            raise LayoutError(
                f"{where}: InferenceModel for {model!r} names GPUPool {key[1]!r} in namespace "
                f"{key[0]!r}, which no manifest given defines: add its GPUPool"
            )
        members.setdefault(key, {})[model] = size
    layout = Layout(
        pools=[PoolLayout(settings=pools[k], members=m) for k, m in members.items()],
        specs=specs,
    )
    layout.check()
    return layout


def _documents(paths: Sequence[Path]) -> Iterable[tuple[str, dict[str, Any]]]:
    files: list[Path] = []
    for path in paths:
        files += sorted([*path.glob("*.yaml"), *path.glob("*.yml")]) if path.is_dir() else [path]
    for file in files:
        try:
            docs = list(yaml.safe_load_all(file.read_text(encoding="utf-8")))
        except OSError as exc:
            raise LayoutError(f"{file}: cannot read it: {exc.strerror or exc}") from None
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise LayoutError(f"{file}: not YAML: {exc}") from None
        for n, doc in enumerate(docs, 1):
            if isinstance(doc, dict):
                yield f"{file} (document {n})", doc


def _pool(where: str, name: str, raw: dict[str, Any]) -> PoolSettings:
    try:
        spec = parse_pool_spec(raw)
    except SpecError as exc:
        raise LayoutError(f"{where}: GPUPool {name}: {exc}") from None
    return PoolSettings(
        name=name,
        memory=spec.memory_bytes,
        host_memory=spec.host_memory_bytes,
        eviction=spec.eviction,
        min_residency=spec.min_residency_seconds,
        headroom=None
        if spec.headroom is None
        else Headroom(wakes=spec.headroom.wakes, idle_after=spec.headroom.idle_after_seconds),
        prime=None if spec.prime is None else Prime(idle_after=spec.prime.idle_after_seconds),
    )


def _model(where: str, name: str, raw: dict[str, Any]) -> tuple[str, InferenceModelSpec]:
    try:
        spec = InferenceModelSpec.model_validate(raw)
    except ValidationError as exc:
        raise LayoutError(
            f"{where}: InferenceModel {name}: {describe_validation_error(exc, prefix='spec')}"
        ) from None
    return spec.model_name or name, spec


def _footprint(where: str, spec: InferenceModelSpec) -> Footprint:
    pool = spec.pool
    assert pool is not None
    memory = pool.memory_bytes
    if memory is None:
        raise LayoutError(
            f"{where}: spec.pool.memory is needed: whatif runs no engine to read its "
            "--gpu-memory-utilization from; write the engine's awake footprint, such as 36Gi"
        )
    asleep = pool.asleep_bytes
    return Footprint(
        memory=memory,
        asleep=asleep,
        weights=pool.weights_bytes or max(memory - asleep, 0),
        priority=pool.priority,
    )


@dataclass(frozen=True, kw_only=True)
class PoolFlags:
    """The pool settings the command line gives (the GPUPool spec's defaults otherwise)."""

    min_residency: float = 30.0
    eviction: Eviction = Eviction.LEAST_RECENTLY_USED
    headroom: Headroom | None = None
    prime: Prime | None = None
    host_memory: int | None = None

    def settings(self, name: str, memory: int) -> PoolSettings:
        """A pool of these settings, named `name`, on a device of `memory` bytes."""
        return PoolSettings(
            name=name,
            memory=memory,
            host_memory=self.host_memory,
            eviction=self.eviction,
            min_residency=self.min_residency,
            headroom=self.headroom,
            prime=self.prime,
        )


def memory_of(texts: Sequence[str]) -> tuple[Footprint | None, dict[str, Footprint]]:
    """`--model-memory` values: `AWAKE[,ASLEEP]` for every model, or `MODEL=AWAKE[,ASLEEP]`
    for one (a model's name may itself hold `=`: the last one separates)."""
    default: Footprint | None = None
    named: dict[str, Footprint] = {}
    for text in texts:
        model, sep, sizes = text.rpartition("=")
        awake, _, asleep = sizes.partition(",")
        try:
            memory = parse_quantity(awake)
            residue = parse_quantity(asleep or ASLEEP_DEFAULT)
        except QuantityError as exc:
            raise LayoutError(f"--model-memory {text}: {exc}") from None
        if residue >= memory:
            raise LayoutError(
                f"--model-memory {text}: a sleeping engine holds less than an awake one: "
                "write AWAKE,ASLEEP such as 36Gi,2Gi"
            )
        size = Footprint(memory=memory, asleep=residue, weights=memory - residue)
        if sep:
            named[model] = size
        else:
            default = size
    return default, named


def from_flags(
    pools: Sequence[str],
    *,
    device_memory: int,
    memory: Sequence[str],
    models: Sequence[str],
    flags: PoolFlags,
) -> Layout:
    """Pools from `--pool NAME=MODEL,MODEL...` on devices of `device_memory` bytes."""
    default, named = memory_of(memory)
    layout = Layout(
        pools=[
            _flag_pool(text, device_memory, default, named, set(models), flags) for text in pools
        ]
    )
    taken: dict[str, str] = {}
    for pool in layout.pools:
        for model in pool.members:
            if model in taken:
                raise LayoutError(
                    f"--pool: {model} is in both {taken[model]} and {pool.settings.name}"
                )
            taken[model] = pool.settings.name
    layout.check()
    return layout


def _flag_pool(
    text: str,
    device_memory: int,
    default: Footprint | None,
    named: Mapping[str, Footprint],
    known: set[str],
    flags: PoolFlags,
) -> PoolLayout:
    name, sep, listed = text.partition("=")
    if not sep or not re.fullmatch(DNS_LABEL, name) or not listed:
        raise LayoutError(
            f"--pool {text}: write NAME=MODEL,MODEL... with NAME a GPUPool's name (lowercase "
            "letters, digits and '-')"
        )
    members: dict[str, Footprint] = {}
    for model in listed.split(","):
        if model not in known:
            raise LayoutError(f"--pool {text}: the trace has no model {model!r}")
        size = named.get(model, default)
        if size is None:
            raise LayoutError(
                f"--pool {text}: how much memory does {model} take? Give --model-memory "
                f"{model}=AWAKE,ASLEEP (or AWAKE,ASLEEP for every model), such as 36Gi,2Gi"
            )
        members[model] = size
    return PoolLayout(settings=flags.settings(name, device_memory), members=members)
