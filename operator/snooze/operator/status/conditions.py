"""Conditions as Kubernetes keeps them (metav1.Condition): their values, and the list to write,
whose transition times stand while a condition's status does."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from snooze.api.modelstatus import Condition
from snooze.api.times import moment


@dataclass(frozen=True, kw_only=True)
class ConditionValue:
    type: str
    status: bool | None
    """None: Unknown (nothing to say yet)."""
    reason: str
    message: str


def conditions(
    previous: Sequence[Condition],
    values: Sequence[ConditionValue],
    *,
    now: float,
    generation: int | None,
) -> list[Condition]:
    """Conditions with lastTransitionTime kept while a condition's status stays the same."""
    before = {c.type: c for c in previous}
    out = []
    for value in values:
        status = "Unknown" if value.status is None else "True" if value.status else "False"
        old = before.get(value.type)
        kept = old is not None and old.status == status
        out.append(
            Condition(
                type=value.type,
                status=status,
                reason=value.reason,
                message=value.message,
                last_transition_time=old.last_transition_time if old and kept else moment(now),
                # metav1.Condition's is an integer, never null: None is left out when written.
                observed_generation=generation,
            )
        )
    return out
