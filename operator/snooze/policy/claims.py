"""Who may use what: which model holds a model name claimed twice, and which pods are shared.

Two tenants can give their InferenceModels the same `modelName`, or select the same pod. Both
would hand one tenant's requests (prompts, credentials) to another's engines, or let two
models fight over one engine. The decisions here make such a clash deterministic: every
replica of the operator and of the gateway, reading the same objects, comes to the same answer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from snooze.api.models import LabelSelector


@dataclass(frozen=True, kw_only=True)
class Claim:
    """One InferenceModel's claim on a model name."""

    namespace: str
    name: str
    created: str
    """metadata.creationTimestamp (RFC 3339, set by the API server: no tenant can backdate it)."""
    holds: bool
    """Its status says it serves the name: the operator wrote that name and no Conflict."""

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)


def holder(claims: Iterable[Claim]) -> Claim | None:
    """The claim that holds a name: one that already holds it keeps it; else the oldest.

    A model that held the name first keeps it even when an older model is renamed onto it;
    among new claims the earliest creation wins, then namespace and name (a total order, so
    that every reader agrees). RFC 3339 times in UTC with `Z` compare as strings.
    """
    claims = list(claims)
    holding = [c for c in claims if c.holds]
    pool = holding or claims
    return min(pool, key=lambda c: (c.created, c.namespace, c.name), default=None)


def shared_pods(
    pods: Mapping[str, Mapping[str, str]], others: Sequence[tuple[str, LabelSelector]]
) -> dict[str, list[str]]:
    """Pods (name -> labels) that other models' selectors also select: name -> those models."""
    shared: dict[str, list[str]] = {}
    for pod, labels in pods.items():
        owners = sorted(name for name, selector in others if selector.matches(labels))
        if owners:
            shared[pod] = owners
    return shared


def workload_problem(
    selector: LabelSelector, *, kind: str, name: str, template_labels: Mapping[str, str]
) -> str | None:
    """Why `spec.scaleTargetRef` names a workload this model does not own, or None.

    Scaling to zero takes a whole workload down: only one whose pods the model's own selector
    selects is the model's to scale, or a typo (or a hostile spec) scales someone else's.
    """
    if selector.matches(template_labels):
        return None
    shown = ", ".join(f"{k}={v}" for k, v in sorted(template_labels.items())) or "none"
    return (
        f"spec.scaleTargetRef: the pods of {kind} {name} (template labels: {shown}) are not "
        f"selected by spec.selector ({selector.to_label_selector()}): Snooze scales only the "
        "workload that runs the model's own pods; name that workload, or fix the selector"
    )
