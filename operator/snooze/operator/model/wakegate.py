"""Whether a woken engine may be published awake: its answer checked against its record before
its first sleep (operator/model/verification.py), and what a wake that failed or was checked wrong
leaves (docs/wake-verification.md). The model's Executor (operator/model/actions.py) asks it."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from snooze.api.agreed import WAKE_PROGRESS_ANNOTATION
from snooze.api.eventreasons import EventReason
from snooze.api.models import EngineState, InferenceModelSpec
from snooze.api.reasons import FailureReason
from snooze.kube.pods import PodInfo
from snooze.operator.events.emit import Emit
from snooze.operator.memory import EngineMemory, ModelMemory, process_of
from snooze.operator.metrics import OperatorMetrics
from snooze.operator.model.stepwords import AFTER_WAKE, with_weights
from snooze.operator.model.verification import Verifier
from snooze.policy.integrity import Check, Verdict

log = logging.getLogger(__name__)

# Publishes a pod's state label (and annotations): the Executor's own label().
Label = Callable[..., Awaitable[None]]


def engine_url(spec: InferenceModelSpec, pod: PodInfo) -> str:
    return f"{spec.engine.scheme}://{pod.ip}:{spec.engine.port}"


class WakeGate:
    """One model's gate between a woken engine and the requests it would serve."""

    def __init__(
        self,
        *,
        verifier: Verifier,
        memory: ModelMemory,
        metrics: OperatorMetrics,
        namespace: str,
        model: str,
        emit: Emit,
        label: Label,
    ) -> None:
        self.verifier, self.memory, self.metrics = verifier, memory, metrics
        self.namespace, self.model = namespace, model
        self._emit, self._label = emit, label

    def count_failure(
        self, pod: PodInfo, spec: InferenceModelSpec, engine: EngineMemory, reason: str, said: str
    ) -> None:
        engine.failed_wake_run = process_of(pod, spec.engine.port)
        engine.wake_failures += 1
        engine.last_failure = time.time()
        engine.last_failure_reason = reason
        engine.last_failure_message = said
        self.memory.failure = (pod.name, reason, said)
        self.metrics.wake_failures.labels(self.namespace, self.model, reason).inc()

    def tell_failure(
        self, pod: PodInfo, spec: InferenceModelSpec, engine: EngineMemory, reason: str, said: str
    ) -> None:
        self._emit(
            "Warning",
            EventReason.WAKE_FAILED,
            f"{pod.name}: wake failed ({reason}, failure {engine.wake_failures} of "
            f"{spec.wake.failure_threshold}): {said}",
        )

    async def checked(self, pod: PodInfo, spec: InferenceModelSpec, engine: EngineMemory) -> bool:
        """Check a woken engine's answer against its record before it is published: False
        (and the engine failed, never routed to) when it answers differently. Where it does,
        its weights are checked too, to say whether they are what changed."""
        verdict = await self._verified(pod, spec, engine)
        return verdict is None or not verdict.failed

    async def checked_after_failed_wake(
        self, pod: PodInfo, spec: InferenceModelSpec, engine: EngineMemory, reason: str, said: str
    ) -> bool:
        """An engine awake after a wake that failed: True (to be published) only when its
        answer was checked and is as before its sleep. Otherwise it is failed, never routed
        to, and remedied by wake.onFailure: a mismatch as any, and an answer that could not
        be checked (nothing recorded, verification off) because nothing says the wake's
        error left it right."""
        verdict = await self._verified(pod, spec, engine)
        if verdict is not None and verdict.state is Check.VERIFIED:
            log.info(
                "%s/%s: woke despite %s, and answers as before", self.namespace, pod.name, reason
            )
            return True
        if verdict is not None and verdict.failed:
            return False
        self._quarantine(pod, spec, engine)
        self.count_failure(pod, spec, engine, reason, said)
        engine.sleep_level = 0
        engine.believe(False, AFTER_WAKE, process_of(pod, spec.engine.port), time.time())
        await self._label(
            pod, EngineState.FAILED, engine, annotations={WAKE_PROGRESS_ANNOTATION: None}
        )
        if not spec.wake.verify:
            why = "verification is off"
        else:
            why = verdict.message if verdict is not None else "nothing recorded to check it by"
        self._emit(
            "Warning",
            EventReason.WAKE_FAILED,
            f"{pod.name}: wake failed ({reason}) and left the engine awake, unchecked ({why}): "
            f"it gets no requests; {_remedy(spec)}. {said}",
        )
        return False

    async def found_awake(
        self,
        pod: PodInfo,
        spec: InferenceModelSpec,
        engine: EngineMemory,
        *,
        was: EngineState | None,
    ) -> bool:
        """An engine found awake under another label, about to be published: True when it may
        be. One left `waking` (a wake cut off by a restart of the operator), `asleep` (woken
        from outside) or `failed` is checked first, as after a wake, if it slept in this run
        of the engine (a restarted container has nothing to check). One whose last wake failed
        in this run (it woke after its wake timed out, say) serves only if its answer was
        checked and matched; otherwise it is quarantined, and wake.onFailure remedies it."""
        if was not in (EngineState.WAKING, EngineState.ASLEEP, EngineState.FAILED):
            return True
        process = process_of(pod, spec.engine.port)
        failed = engine.failed_wake_run
        if failed is None or not failed.same_as(process):
            unrecorded = self.verifier.current(engine, process).output is Check.PENDING
            if unrecorded and was is not EngineState.WAKING:
                return True  # it has not slept in this run (a restarted container): not woken
            return await self.checked(pod, spec, engine)
        verdict = await self._verified(pod, spec, engine)
        if verdict is not None and verdict.state is Check.VERIFIED:
            engine.failed_wake_run = None
            return True
        if verdict is None or not verdict.failed:
            self._quarantine(pod, spec, engine)
        return False

    async def _verified(
        self, pod: PodInfo, spec: InferenceModelSpec, engine: EngineMemory
    ) -> Verdict | None:
        """The woken engine's answer against its record (None: verification is off, or there
        is nothing to compare); a mismatch has failed the engine (failed_check) by then."""
        if not spec.wake.verify:
            return None
        url, process = engine_url(spec, pod), process_of(pod, spec.engine.port)
        verdict = await self.verifier.output_after_wake(
            url, spec.model_name or self.model, engine, process
        )
        if verdict is not None and verdict.failed:
            weights = await self.verifier.weights_after_wake(url, engine, process)
            await self.failed_check(
                pod, spec, engine, FailureReason.OUTPUT_MISMATCH, with_weights(verdict, weights)
            )
        return verdict

    def _quarantine(self, pod: PodInfo, spec: InferenceModelSpec, engine: EngineMemory) -> None:
        """Never routed to again in this run of the engine: wake.onFailure remedies it."""
        self.verifier.current(engine, process_of(pod, spec.engine.port)).quarantined = True

    async def failed_check(
        self,
        pod: PodInfo,
        spec: InferenceModelSpec,
        engine: EngineMemory,
        reason: str,
        what: str,
    ) -> None:
        """A wake that left the engine answering (or weighing) differently: failed, the
        engine labelled `failed` (never routed to), and remedied by wake.onFailure."""
        engine.failed_wake_run = process_of(pod, spec.engine.port)
        engine.wake_failures += 1
        engine.last_failure = time.time()
        engine.last_failure_reason = reason
        engine.last_failure_message = f"woke but {what}"
        self.memory.failure = (pod.name, reason, engine.last_failure_message)
        self.metrics.wake_failures.labels(self.namespace, self.model, reason).inc()
        engine.sleep_level = 0
        engine.believe(False, AFTER_WAKE, process_of(pod, spec.engine.port), time.time())
        await self._label(
            pod, EngineState.FAILED, engine, annotations={WAKE_PROGRESS_ANNOTATION: None}
        )
        self._emit(
            "Warning",
            EventReason.WAKE_FAILED,
            f"{pod.name}: wake failed ({reason}): it woke but {what}; it gets no requests; "
            f"{_remedy(spec)}",
        )


def _remedy(spec: InferenceModelSpec) -> str:
    if spec.wake.on_failure == "Restart":
        return "wake.onFailure is Restart: the pod is deleted so that its controller recreates it"
    return "wake.onFailure is Report: it stays unrouted until its pod or container restarts"
