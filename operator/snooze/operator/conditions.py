"""Conditions as Kubernetes keeps them (metav1.Condition): their values, and the list to write,
whose transition times stand while a condition's status does."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from snooze.kube.pods import format_time

JSON = dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class ConditionValue:
    type: str
    status: bool
    reason: str
    message: str


def conditions(
    previous: Sequence[JSON],
    values: Sequence[ConditionValue],
    *,
    now: float,
    generation: int | None,
) -> list[JSON]:
    """Conditions with lastTransitionTime kept while a condition's status stays the same."""
    before = {c.get("type"): c for c in previous}
    out = []
    for value in values:
        status = "True" if value.status else "False"
        old = before.get(value.type, {})
        since = old.get("lastTransitionTime") if old.get("status") == status else None
        condition: JSON = {
            "type": value.type,
            "status": status,
            "reason": value.reason,
            "message": value.message,
            "lastTransitionTime": since or format_time(now),
        }
        if generation is not None:  # metav1.Condition's is an integer, never null
            condition["observedGeneration"] = generation
        out.append(condition)
    return out
