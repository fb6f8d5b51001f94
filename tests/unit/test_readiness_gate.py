"""The snooze.dev/awake readiness gate as data: what a pod's manifest says of it (kube/pods.py),
which condition each engine state calls for and when it is written (policy/readiness.py), and
the patch that writes it (operator/model/readiness.py)."""

from __future__ import annotations

from typing import Any

import builders
import pytest

from snooze.kube.pods import pod_info
from snooze.operator.model.readiness import gate_patch
from snooze.policy.readiness import AWAKE, GATES, NOT_PROBED, UNREADY, gate_for, gate_write

GATE = "snooze.dev/awake"


def pod(
    *,
    gates: list[str] | None = None,
    conditions: dict[str, str] | None = None,
    gate: tuple[str, str] | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    """The builders' pod, running, with these readiness gates and conditions (the tests' axes)."""
    found = [{"type": kind, "status": value} for kind, value in (conditions or {}).items()]
    if gate is not None:
        found.append({"type": GATE, "status": gate[0], "reason": gate[1]})
    meta = {"deletionTimestamp": "2026-01-01T00:00:00Z"} if deleting else {}
    spec = {} if gates is None else {"readinessGates": [{"conditionType": g} for g in gates]}
    return builders.pod(
        namespace="ns", uid="u", spec=spec, status=builders.running("10.0.0.1", *found), **meta
    )


# -- What a pod says ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gates", "conditions", "ready"),
    [
        # Without gates, Ready is the kubelet's word that the containers are ready.
        (None, {"Ready": "True", "ContainersReady": "True"}, True),
        (None, {"Ready": "False", "ContainersReady": "True"}, False),
        (None, {"Ready": "True"}, True),
        # With Snooze's gate, the pod is NotReady while its engine sleeps: its containers say
        # whether the engine has loaded, never Ready (which the gate itself holds down).
        ([GATE], {"Ready": "False", "ContainersReady": "True"}, True),
        ([GATE], {"Ready": "True", "ContainersReady": "False"}, False),
        ([GATE], {"Ready": "True"}, False),
        # Another controller's gate holds Ready down just the same.
        (["example.com/other"], {"Ready": "False", "ContainersReady": "True"}, True),
    ],
)
def test_an_engine_is_judged_by_its_containers_where_gates_hold_ready_down(
    gates: list[str] | None, conditions: dict[str, str], ready: bool
) -> None:
    assert pod_info(pod(gates=gates, conditions=conditions)).ready is ready


def test_a_deleted_pod_is_not_ready_whatever_its_containers_say() -> None:
    body = pod(gates=[GATE], conditions={"ContainersReady": "True"}, deleting=True)
    assert not pod_info(body).ready


def test_only_snoozes_own_gate_makes_a_pod_gated() -> None:
    assert pod_info(pod(gates=[GATE])).gated
    assert not pod_info(pod(gates=["example.com/awake", "snooze.dev/awake-not"])).gated
    assert not pod_info(pod()).gated
    # A malformed entry (a pod owner can write anything there the API accepts) is no gate.
    body = pod()
    body["spec"]["readinessGates"] = ["snooze.dev/awake", None, {"conditionType": 7}]
    assert not pod_info(body).gated


def test_the_gate_as_the_pod_shows_it() -> None:
    assert pod_info(pod(gates=[GATE])).gate is None
    assert pod_info(pod(gates=[GATE], gate=("True", "Awake"))).gate == (True, "Awake")
    assert pod_info(pod(gates=[GATE], gate=("False", "Asleep"))).gate == (False, "Asleep")
    assert pod_info(pod(gates=[GATE], gate=("Unknown", ""))).gate == (False, "")


# -- Which condition, and when ----------------------------------------------------------------


def test_only_an_awake_engine_serves() -> None:
    assert gate_for("awake") is AWAKE and AWAKE.serves
    for state in ("draining", "asleep", "waking", "failed", "unreachable"):
        assert not gate_for(state).serves
        assert gate_for(state) is GATES[state]
    assert {g.reason for g in GATES.values()} == {
        "Awake",
        "Draining",
        "Asleep",
        "Waking",
        "WakeFailed",
        "Unreachable",
    }
    # Anything the operator has not vouched for does not serve.
    for state in ("unknown", "shared", "", "Awake", "awake "):
        assert gate_for(state) is NOT_PROBED


@pytest.mark.parametrize(
    ("state", "shown", "written"),
    [
        # A new pod: the gate is written once the engine is known.
        ("awake", None, AWAKE),
        ("asleep", None, GATES["asleep"]),
        ("unknown", None, NOT_PROBED),
        # Shown already: nothing is written, whatever the cycle (never once per probe).
        ("awake", (True, "Awake"), None),
        ("asleep", (False, "Asleep"), None),
        # A change of state is one write, the reason included.
        ("draining", (True, "Awake"), GATES["draining"]),
        ("asleep", (False, "Draining"), GATES["asleep"]),
        ("awake", (False, "Waking"), AWAKE),
        # Someone else wrote True on a sleeping engine: set right.
        ("asleep", (True, "Awake"), GATES["asleep"]),
        # Containers not ready: Ready is False anyway, only a True is taken back.
        ("unready", None, None),
        ("unready", (False, "Asleep"), None),
        ("unready", (True, "Awake"), UNREADY),
        ("unready", (False, "ContainersNotReady"), None),
    ],
)
def test_gate_write(state: str, shown: tuple[bool, str] | None, written: object) -> None:
    assert gate_write(state, shown) == written


def test_every_state_settles_after_one_write() -> None:
    """Bounded: once what gate_write asked for is written, it asks for nothing more."""
    for state in [*GATES, "unknown", "unready"]:
        for shown in [None, (True, "Awake"), (False, "Asleep"), (False, "")]:
            gate = gate_write(state, shown)
            if gate is not None:
                assert gate_write(state, gate.shown) is None, (state, shown)


# -- The patch --------------------------------------------------------------------------------


def test_the_patch_is_one_condition_and_moves_its_transition_time_only_on_a_flip() -> None:
    patch = gate_patch(GATES["draining"], (True, "Awake"), 0.0)
    [condition] = patch["status"]["conditions"]  # type: ignore[index]
    assert condition == {
        "type": GATE,
        "status": "False",
        "reason": "Draining",
        "message": GATES["draining"].message,
        "lastTransitionTime": "1970-01-01T00:00:00.000Z",
    }
    assert set(patch) == {"status"}
    # False to False: a new reason, the same status since the same time.
    kept = gate_patch(GATES["asleep"], (False, "Draining"), 5.0)
    assert "lastTransitionTime" not in kept["status"]["conditions"][0]  # type: ignore[index]
    first = gate_patch(AWAKE, None, 5.0)
    assert first["status"]["conditions"][0]["status"] == "True"  # type: ignore[index]
    assert "lastTransitionTime" in first["status"]["conditions"][0]  # type: ignore[index]
