"""The second tier's decision (snooze.policy.scale), as a table."""

from __future__ import annotations

from typing import Any

import pytest

from snooze.api.models import InferenceModelSpec
from snooze.policy.scale import ScaleKind, ScaleView, decide_scale

NOW = 10_000.0
BASE: dict[str, Any] = {
    "selector": {"matchLabels": {"app": "m"}},
    "scaleTargetRef": {"kind": "Deployment", "name": "m"},
    "idle": {"after": "10m"},
    "scaleToZeroAfter": "1h",
}


def view(spec: dict[str, Any] | None = None, **facts: Any) -> ScaleView:
    values: dict[str, Any] = {
        "replicas": 2,
        "scaled_from": None,
        "scaled_at": None,
        "manual_at": None,
        "last_activity": NOW - 3601,
        "all_asleep": True,
        "wake_requested": None,
        "now": NOW,
    }
    values.update(facts)
    return ScaleView(spec=InferenceModelSpec.model_validate({**BASE, **(spec or {})}), **values)


CASES: list[tuple[str, ScaleView, ScaleKind | None, int | None]] = [
    ("idle past scaleToZeroAfter, all asleep", view(), ScaleKind.TO_ZERO, 2),
    ("not idle long enough", view(last_activity=NOW - 3599), None, None),
    ("an engine still awake", view(all_asleep=False), None, None),
    ("no scale target", view(spec={"scaleToZeroAfter": None, "scaleTargetRef": None}), None, None),
    ("tier off", view(spec={"scaleToZeroAfter": None}), None, None),
    ("minAwake forbids it", view(spec={"minAwake": 1}), None, None),
    ("desiredState Asleep keeps pods", view(spec={"desiredState": "Asleep"}), None, None),
    ("workload unreadable", view(replicas=None), None, None),
    ("wanted since last active", view(wake_requested=NOW - 10), None, None),
    (
        "scaled by hand in this idle period",
        view(manual_at=NOW - 100, last_activity=NOW - 4000),
        None,
        None,
    ),
    (
        "scaled by hand before the last activity",
        view(manual_at=NOW - 5000, last_activity=NOW - 4000),
        ScaleKind.TO_ZERO,
        2,
    ),
    (
        "at zero, wake request after it",
        view(replicas=0, scaled_from=3, scaled_at=NOW - 50, wake_requested=NOW - 1),
        ScaleKind.UP,
        3,
    ),
    (
        "at zero, older wake request",
        view(replicas=0, scaled_from=3, scaled_at=NOW - 50, wake_requested=NOW - 60),
        None,
        None,
    ),
    (
        "at zero, onRequest off",
        view(
            spec={"wake": {"onRequest": False}},
            replicas=0,
            scaled_from=3,
            scaled_at=NOW - 50,
            wake_requested=NOW - 1,
        ),
        None,
        None,
    ),
    (
        "at zero, desiredState Awake",
        view(spec={"desiredState": "Awake"}, replicas=0, scaled_from=2, scaled_at=NOW - 50),
        ScaleKind.UP,
        2,
    ),
    (
        "at zero, tier turned off",
        view(spec={"scaleToZeroAfter": None}, replicas=0, scaled_from=2, scaled_at=NOW - 50),
        ScaleKind.UP,
        2,
    ),
    (
        "at zero, someone scaled it up",
        view(replicas=4, scaled_from=2, scaled_at=NOW - 50),
        ScaleKind.NOTE_MANUAL,
        4,
    ),
    ("zero by someone else's hand", view(replicas=0), ScaleKind.NOTE_MANUAL, 0),
    ("zero by hand, noted, no request", view(replicas=0, manual_at=NOW - 10), None, None),
    (
        "zero by hand, then a request",
        view(replicas=0, manual_at=NOW - 10, wake_requested=NOW - 1),
        ScaleKind.UP,
        1,
    ),
]


@pytest.mark.parametrize(("case", "facts", "kind", "replicas"), CASES, ids=[c[0] for c in CASES])
def test_decide_scale(
    case: str, facts: ScaleView, kind: ScaleKind | None, replicas: int | None
) -> None:
    decision = decide_scale(facts)
    if kind is None:
        assert decision is None
    else:
        assert decision is not None and decision.kind is kind and decision.replicas == replicas
