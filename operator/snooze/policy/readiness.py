"""The snooze.dev/awake readiness gate: what its condition says of an engine in each state, and
when it must be written. Pure: a state and what the pod shows in, a condition (or nothing) out.

A pod that lists the gate is Ready only while its condition is "True", so every Service,
EndpointSlice and InferencePool (the endpoint picker takes only Ready pods as candidates) sends
it requests only while the operator says its engine serves.
"""

from __future__ import annotations

from dataclasses import dataclass

from snooze.api.conditions import GateReason
from snooze.api.models import EngineState
from snooze.api.modelstatus import PodState


@dataclass(frozen=True)
class Gate:
    """One value of the condition."""

    serves: bool
    """Its status: "True" while the engine serves."""
    reason: str
    message: str

    @property
    def shown(self) -> tuple[bool, str]:
        """As a pod shows it (PodInfo.gate)."""
        return self.serves, self.reason


AWAKE = Gate(True, GateReason.AWAKE, "the engine is awake and serves")
# Keyed by the engine's state as the model's status lists it (status.pods[].state).
GATES: dict[str, Gate] = {
    EngineState.AWAKE: AWAKE,
    EngineState.DRAINING: Gate(
        False,
        GateReason.DRAINING,
        "the engine is draining before it sleeps: new requests go elsewhere while running "
        "ones finish",
    ),
    EngineState.ASLEEP: Gate(
        False,
        GateReason.ASLEEP,
        "the engine sleeps: a request queued for its model wakes it (see its InferenceModel)",
    ),
    EngineState.WAKING: Gate(
        False,
        GateReason.WAKING,
        "the engine is waking: it serves once its wake is done and checked",
    ),
    EngineState.FAILED: Gate(
        False,
        GateReason.WAKE_FAILED,
        "the engine failed to wake, or woke answering wrong: its InferenceModel's status says why",
    ),
    PodState.UNREACHABLE: Gate(
        False,
        GateReason.UNREACHABLE,
        "the engine does not answer Snooze's probes: it gets no requests until it does",
    ),
}
NOT_PROBED = Gate(
    False, GateReason.NOT_PROBED, "Snooze has not heard from the engine yet: it serves once it has"
)
UNREADY = Gate(False, GateReason.CONTAINERS_NOT_READY, "the pod's containers are not ready")
RELEASED = Gate(
    True,
    GateReason.RELEASED,
    "the engine is awake and its InferenceModel is deleted: Snooze no longer puts it to sleep",
)


def gate_for(state: str) -> Gate:
    """The condition for an engine in `state` (the status's word for it: awake, draining,
    asleep, waking, failed, unreachable; anything else has not been heard from yet)."""
    if state == PodState.UNREADY:
        return UNREADY
    return GATES.get(state, NOT_PROBED)


def gate_write(state: str, shown: tuple[bool, str] | None) -> Gate | None:
    """The condition to write on a gated pod whose engine is in `state`, where the pod shows
    `shown` (None: no such condition yet); None when nothing needs writing. Written once per
    change of state, never again while the pod shows it. A pod whose containers are not ready
    is not Ready whatever the gate says: its condition is written only to take back a "True",
    which would otherwise make the pod Ready the moment its containers are, before the
    operator has heard from the engine's new run."""
    wanted = gate_for(state)
    if wanted is UNREADY and (shown is None or not shown[0]):
        return None
    return None if shown == wanted.shown else wanted
