"""What a model's or a pod's last event showed of what matters to the loops, kept so that an
event that changes none of it (the echo of the operator's own writes) pokes no loop."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from snooze.api.agreed import STATE_LABEL
from snooze.kube.pods import PodInfo
from snooze.policy.claims import Claim


@dataclass(frozen=True, kw_only=True)
class ModelSighting:
    """An InferenceModel as its loop and its neighbours care: a status write changes none."""

    generation: int | None
    annotations: tuple[tuple[str, str], ...]
    deletion: str | None
    """metadata.deletionTimestamp."""
    claim: tuple[str, Claim] | None
    """Its claim on a model name (indexes.model), None for an invalid spec."""

    @classmethod
    def of(cls, body: Mapping[str, Any], claim: tuple[str, Claim] | None) -> ModelSighting:
        meta = body.get("metadata") or {}
        return cls(
            generation=meta.get("generation"),
            annotations=tuple(sorted((meta.get("annotations") or {}).items())),
            deletion=meta.get("deletionTimestamp"),
            claim=claim,
        )

    def claimed_name(self) -> str | None:
        return None if self.claim is None else self.claim[0]


@dataclass(frozen=True, kw_only=True)
class PodSighting:
    """A pod as routing and selection care: its own state label (the operator's write) aside."""

    ready: bool
    ip: str | None
    uid: str
    deleted: bool
    labels: tuple[tuple[str, str], ...]
    """Its labels but snooze.dev/state, sorted."""

    @classmethod
    def of(cls, info: PodInfo, *, deleted: bool) -> PodSighting:
        return cls(
            ready=info.ready,
            ip=info.ip,
            uid=info.uid,
            deleted=deleted,
            labels=tuple(sorted((k, v) for k, v in info.labels.items() if k != STATE_LABEL)),
        )
