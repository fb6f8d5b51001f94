"""The snooze.dev/awake readiness gate of one model's pods, written through pods/status: by the
actions as they change an engine's state (actions.py: False before a drain begins, True once a
wake is done and checked), and set right by the loop for a pod that shows something else (a new
pod, an engine that stopped answering, a condition someone else wrote).

Only pods that list the gate are written, and each at most once per change of state: never at
every probe. The patch is a strategic merge of one condition, which leaves the kubelet's own
conditions as they are (a merge patch would replace the whole list).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterable
from typing import Any

from snooze.api.agreed import AWAKE_CONDITION
from snooze.api.modelstatus import PodState
from snooze.kube.api import STRATEGIC_MERGE_PATCH, KubeApi, KubeError, pods_ref
from snooze.kube.pods import PodInfo, condition_patch
from snooze.operator.memory import EngineMemory, ModelMemory
from snooze.operator.status import model as status
from snooze.policy.readiness import Gate, gate_write
from snooze.policy.sleep import retry_delay

log = logging.getLogger(__name__)


def gate_patch(gate: Gate, shown: tuple[bool, str] | None, now: float) -> dict[str, Any]:
    """Pure: the patch of pods/status that writes `gate` over `shown`. Its transition time
    moves only when its status does (a strategic merge keeps the one written)."""
    flips = shown is None or shown[0] != gate.serves
    return condition_patch(
        AWAKE_CONDITION,
        status=gate.serves,
        reason=gate.reason,
        message=gate.message,
        since=now if flips else None,
    )


def engine_state(memory: ModelMemory, pod: PodInfo) -> str:
    """The engine's state as the model's status lists it (status.build)."""
    if not pod.ready:
        return PodState.UNREADY
    engine = memory.engines.get(pod.name)
    if engine is not None and engine.unreachable:
        return PodState.UNREACHABLE
    view = status.operator_view(memory, pod)
    return view.value if view is not None else PodState.UNKNOWN


class ReadinessGates:
    """Writes the gate of one model's pods."""

    def __init__(self, *, namespace: str, api: KubeApi) -> None:
        self.namespace = namespace
        self.api = api
        self._failed: dict[str, tuple[int, float]] = {}
        """Pod -> (writes failed in a row, when to try again): a refused write is not sent
        again at every cycle."""

    async def write(self, pod: PodInfo, engine: EngineMemory, gate: Gate) -> None:
        """Write `gate` on the pod (KubeError if the API refuses), unless it shows it already."""
        shown = engine.gate_of(pod)
        if shown == gate.shown:
            return
        path = pods_ref(self.namespace).item(pod.name, "status")
        try:
            answer = await self.api.request(
                "PATCH",
                path,
                body=gate_patch(gate, shown, time.time()),
                content_type=STRATEGIC_MERGE_PATCH,
            )
        except KubeError as exc:
            failures = self._failed.get(pod.name, (0, 0.0))[0] + 1
            self._failed[pod.name] = (failures, time.time() + retry_delay(failures))
            log.log(
                logging.WARNING if failures == 1 else logging.DEBUG,
                "%s/%s: cannot write its %s condition (%s %s): %s; the chart grants patch on "
                "pods/status, which this needs",
                self.namespace,
                pod.name,
                AWAKE_CONDITION,
                gate.serves,
                gate.reason,
                exc,
            )
            raise
        self._failed.pop(pod.name, None)
        version = (answer.get("metadata") or {}).get("resourceVersion") if answer else None
        engine.gate = gate.shown
        engine.wrote(before=pod.resource_version, after=str(version or ""))

    async def settle(self, pod: PodInfo, engine: EngineMemory, gate: Gate) -> None:
        """Write `gate` as an action changes the engine's state; a refusal is left to the loop
        to write again (`reconcile`)."""
        with contextlib.suppress(KubeError):  # logged by write
            await self.write(pod, engine, gate)

    async def reconcile(self, pods: Iterable[PodInfo], memory: ModelMemory) -> None:
        """Write the gate of each gated pod that shows another condition than its engine's
        state calls for, but those an action is changing (the action writes it) and those
        being deleted."""
        now = time.time()
        names = set()
        for pod in pods:
            names.add(pod.name)
            engine = memory.engines.get(pod.name)
            if not pod.gated or pod.deleting or engine is None or engine.acting:
                continue
            gate = gate_write(engine_state(memory, pod), engine.gate_of(pod))
            if gate is None:
                continue
            failed = self._failed.get(pod.name)
            if failed is not None and now < failed[1]:
                continue
            await self.settle(pod, engine, gate)
        for gone in self._failed.keys() - names:
            del self._failed[gone]
