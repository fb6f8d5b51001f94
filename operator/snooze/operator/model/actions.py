"""Carry out the policy's actions on one model's engines: drain and sleep, wake, restart, label.

Each action runs as its own task so that a long drain or wake never stalls the probes of
the other engines; the memory records the one task per engine, so no engine ever has two.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from snooze.api.agreed import (
    RELEASED_ANNOTATION,
    SLEEP_LEVEL_ANNOTATION,
    SLEEP_SENT_ANNOTATION,
    SLEEP_STARTED_ANNOTATION,
    STATE_LABEL,
    WAKE_PROGRESS_ANNOTATION,
)
from snooze.api.conditions import ConditionReason
from snooze.api.eventreasons import EventReason
from snooze.api.models import EngineState, InferenceModelSpec, Phase
from snooze.api.reasons import FailureReason
from snooze.api.times import format_time
from snooze.engine.client import RELOAD, WEIGHTS, EngineHttp
from snooze.engine.errors import EngineError, OutOfMemoryError, SleepModeDisabledError
from snooze.engine.interface import SleepingEngine, engine_client
from snooze.kube.api import KubeApi, KubeError, pods_ref
from snooze.kube.pods import PodInfo, released_text
from snooze.kube.writes import WriteYielded, urgent
from snooze.operator.events.emit import Emit
from snooze.operator.memory import EngineMemory, ModelMemory, outstanding_of, process_of
from snooze.operator.metrics import OperatorMetrics
from snooze.operator.model.firstrecord import record_unless_woken
from snooze.operator.model.readiness import ReadinessGates
from snooze.operator.model.stepwords import AFTER_SLEEP, AFTER_WAKE, why
from snooze.operator.model.verification import Verifier
from snooze.operator.model.wakegate import WakeGate, engine_url
from snooze.operator.settings import Settings, sleep_timeout
from snooze.policy.readiness import gate_for
from snooze.policy.sleep import Action, ActionKind, ActionReason, retry_delay

__all__ = ["Executor", "engine_url"]
log = logging.getLogger(__name__)
# What the operator did, one line each (events.teller logs the actions that post an Event).
told = logging.getLogger("snooze.operator.events")


# The marks of a drain, removed when it ends without a sleep.
UNMARKED: dict[str, str | None] = {SLEEP_STARTED_ANNOTATION: None, SLEEP_SENT_ANNOTATION: None}

# (label left by a cut-off step, label the engine's answer calls for) -> (Event reason, state).
RECOVERED: dict[tuple[EngineState | None, EngineState | None], tuple[EventReason, str]] = {
    (EngineState.DRAINING, EngineState.ASLEEP): (EventReason.SLEPT, "asleep"),
    (EngineState.DRAINING, EngineState.AWAKE): (EventReason.SLEEP_CANCELLED, "awake, not asleep"),
    (EngineState.WAKING, EngineState.AWAKE): (EventReason.WOKE, "awake"),
    (EngineState.WAKING, EngineState.ASLEEP): (EventReason.WAKE_INTERRUPTED, "still asleep"),
}


class Executor:
    """Starts actions for one model and records their outcome in its memory."""

    def __init__(
        self,
        *,
        namespace: str,
        api: KubeApi,
        http: EngineHttp,
        memory: ModelMemory,
        settings: Settings,
        emit: Emit,
        metrics: OperatorMetrics,
        model: str,
        pool_of: Callable[[PodInfo], str | None] = lambda _: None,
        made_room: Callable[[PodInfo], None] = lambda _: None,
    ) -> None:
        self.namespace = namespace
        self.model = model
        self.metrics = metrics
        self.api = api
        self.http = http
        self.memory = memory
        self.settings = settings
        self.emit = emit
        self.pool_of = pool_of
        """The GPU pool a pod is a member of (None: none)."""
        self.made_room = made_room
        """Told when a member's sleep to make room on its pool begins."""
        self.verifier = Verifier(http=http, metrics=metrics, namespace=namespace, model=model)
        self.gate = WakeGate(
            verifier=self.verifier,
            memory=memory,
            metrics=metrics,
            namespace=namespace,
            model=model,
            emit=emit,
            label=self.label,
        )
        self.gates = ReadinessGates(namespace=namespace, api=api)
        """The snooze.dev/awake readiness gate of the pods that list it."""

    def start(
        self, action: Action, pod: PodInfo, spec: InferenceModelSpec
    ) -> asyncio.Task[None] | None:
        """Start `action` on `pod` in a task of its own (None when nothing was started)."""
        engine = self.memory.engine(pod.name, now=time.time())
        if action.kind is ActionKind.CANCEL_SLEEP:
            engine.cancel.set()
            return None
        if engine.acting:
            return None  # the policy never asks this; a guard costs nothing
        step = {
            ActionKind.SLEEP: self._sleep,
            ActionKind.WAKE: self._wake,
            ActionKind.RESTART: self._restart,
            ActionKind.LABEL: self._label_action,
            ActionKind.MARK_FAILED: self._mark_failed,
        }[action.kind]
        engine.cancel.clear()
        engine.action = action.kind.value
        self.verifier.kind = spec.engine.kind  # its checks are asked as the engine's kind asks
        if action.kind in (ActionKind.SLEEP, ActionKind.WAKE, ActionKind.RESTART):
            engine.prompted = True  # the engine's next claim may differ: no contradiction
        engine.task = asyncio.create_task(
            self._guarded(step, action, pod, spec, engine), name=f"{action.kind}:{pod.name}"
        )
        return engine.task

    async def _guarded(
        self,
        step: Callable[[Action, PodInfo, InferenceModelSpec, EngineMemory], Awaitable[None]],
        action: Action,
        pod: PodInfo,
        spec: InferenceModelSpec,
        engine: EngineMemory,
    ) -> None:
        try:
            # A wake's writes go before those of other models' churn (kube/writes.py).
            with urgent() if action.kind is ActionKind.WAKE else contextlib.nullcontext():
                await step(action, pod, spec, engine)
        except KubeError as exc:
            log.warning("%s on %s/%s: API error: %s", action.kind, self.namespace, pod.name, exc)
            self._backoff(action, engine, FailureReason.API_ERROR, str(exc))
        except Exception as exc:
            log.exception("%s on %s/%s failed", action.kind, self.namespace, pod.name)
            self._backoff(action, engine, type(exc).__name__, str(exc))
        finally:
            # Let the loop publish the outcome now. Its next probe comes at its pace, not at
            # once: the outcome is known (the step's own checks), and an engine whose claims
            # contradict it would otherwise be acted on again at every probe.
            self.memory.poke.set()

    @staticmethod
    def _backoff(action: Action, engine: EngineMemory, reason: str, message: str) -> None:
        """A sleep that failed outside the engine (the API refused a label) backs off like
        one the engine refused: retried at every probe, it would drain the pod again and
        again."""
        if action.kind is ActionKind.SLEEP:
            engine.sleep_failures += 1
            engine.last_sleep_failure = time.time()
            engine.sleep_failure_reason, engine.sleep_failure_message = reason, message

    async def label(
        self,
        pod: PodInfo,
        state: EngineState,
        engine: EngineMemory,
        *,
        annotations: dict[str, str | None] | None = None,
        yield_to: asyncio.Event | None = None,
    ) -> None:
        metadata: dict[str, object] = {"labels": {STATE_LABEL: state.value}}
        if annotations:
            metadata["annotations"] = annotations
        was = engine.label_of(pod)
        gate = gate_for(state.value) if pod.gated else None
        if gate is not None and not gate.serves:
            # Out of every Service and InferencePool first: new requests stop before a drain
            # waits for the running ones, and a drain whose pod stays in them does not begin.
            if state is EngineState.DRAINING:
                await self.gates.write(pod, engine, gate)
            else:
                await self.gates.settle(pod, engine, gate)
        await self.patch_pod(pod, engine, metadata, yield_to=yield_to)
        if gate is not None and gate.serves:
            await self.gates.settle(pod, engine, gate)  # routable from here, as by the label
        if state is EngineState.AWAKE and was is not EngineState.AWAKE:
            # Routable only from now (the gateway sends nothing to a pod not labelled awake):
            # its idle clock starts now, and any wake request made before is answered.
            engine.last_activity = max(engine.last_activity, time.time())
            engine.woke_at = time.time()
        engine.published = state
        if state.value not in engine.state_since:
            engine.state_since = {state.value: time.time()}

    async def patch_pod(
        self,
        pod: PodInfo,
        engine: EngineMemory,
        metadata: dict[str, object],
        *,
        yield_to: asyncio.Event | None = None,
    ) -> None:
        """Patch the pod's metadata, and remember which versions of the pod this write made
        stale (see EngineMemory.wrote)."""
        answer = await self.api.patch(
            pods_ref(self.namespace), pod.name, {"metadata": metadata}, yield_to=yield_to
        )
        version = (answer.get("metadata") or {}).get("resourceVersion") if answer else None
        engine.wrote(before=pod.resource_version, after=str(version or ""))

    async def _label_action(
        self, action: Action, pod: PodInfo, spec: InferenceModelSpec, engine: EngineMemory
    ) -> None:
        if action.label is None:
            return
        # The pod's label as this process saw it; the label it wrote itself, if the pod index
        # still shows an older one (then this is no leftover, only a late echo).
        before = pod.state if engine.published is None else engine.published
        if action.label is EngineState.AWAKE and not await self.gate.found_awake(
            pod, spec, engine, was=before
        ):
            return  # an engine found awake under another label is checked before it serves
        with urgent() if action.label is EngineState.AWAKE else contextlib.nullcontext():
            await self.label(pod, action.label, engine)
        # The pod index lags behind this process's own writes: a label written again is an
        # echo, not news.
        told.log(
            logging.DEBUG if before is action.label else logging.INFO,
            "%s/%s Labelled: %s: %s (was %s), as its engine answers",
            self.namespace,
            self.model,
            pod.name,
            action.label.value,
            before.value if before is not None else "unlabelled",
            extra={"model": self.model, "namespace": self.namespace, "reason": "Labelled"},
        )
        # A step cut off by a restart of the operator ended inside the engine meanwhile: say
        # how it ended, since the Event its own action would have posted never was.
        outcome = RECOVERED.get((before, action.label))
        if outcome is not None and before is not None:
            reason, state = outcome
            self.emit(
                "Normal",
                reason,
                f"{pod.name}: found {state} after a {before.value} step that the operator did "
                "not see end (it restarted, or the engine stopped answering meanwhile)",
            )

    async def _mark_failed(
        self, action: Action, pod: PodInfo, spec: InferenceModelSpec, engine: EngineMemory
    ) -> None:
        await self.label(pod, EngineState.FAILED, engine)
        self.emit(
            "Warning",
            EventReason.WAKE_GAVE_UP,
            f"{pod.name}: gave up waking after {engine.wake_failures} failures "
            f"({engine.last_failure_reason}); wake.onFailure is Report. "
            f"{engine.last_failure_message}",
        )

    async def _restart(
        self, action: Action, pod: PodInfo, spec: InferenceModelSpec, engine: EngineMemory
    ) -> None:
        await self.api.delete(pods_ref(self.namespace), pod.name)
        engine.deleted = True
        if action.reason == FailureReason.MEMORY_NOT_FREED:
            reason = action.reason
            why = "its sleep did not give its GPU pool's device its memory back"
        else:
            reason = engine.last_failure_reason or ConditionReason.WAKE_FAILED
            why = (
                f"its engine failed to wake {engine.wake_failures} time(s) "
                f"({engine.last_failure_reason})"
            )
        self.metrics.restarts.labels(self.namespace, self.model, reason).inc()
        self.emit(
            "Warning",
            EventReason.POD_RESTARTED,
            f"deleted {pod.name} so that its controller recreates it: {why}",
        )

    def _client(
        self, spec: InferenceModelSpec, pod: PodInfo, engine: EngineMemory
    ) -> SleepingEngine:
        """The engine's client, of its kind. An SGLang server's sleep state is kept on its pod
        (RELEASED_ANNOTATION), written before each call that changes it."""
        process = process_of(pod, spec.engine.port)

        async def record(outstanding: frozenset[str]) -> None:
            value = released_text(process.restarts, outstanding)
            await self.patch_pod(pod, engine, {"annotations": {RELEASED_ANNOTATION: value}})

        return engine_client(
            spec.engine.kind,
            engine_url(spec, pod),
            client=self.http,
            timeout=self.settings.probe_timeout,
            outstanding=outstanding_of(pod, process),
            record=record,
        )

    async def _sleep(
        self, action: Action, pod: PodInfo, spec: InferenceModelSpec, engine: EngineMemory
    ) -> None:
        client = self._client(spec, pod, engine)
        if action.reason == ActionReason.MAKE_ROOM and await _busy(client):
            # The pool chose it on a probe older than this: a member serving requests is not
            # put to sleep for another; the pool sees it busy now and chooses again.
            now = time.time()
            engine.saw_busy(now)
            self.memory.last_activity = now
            log.info("%s/%s: busy, so not put to sleep to make room", self.namespace, pod.name)
            return
        if action.reason == ActionReason.MAKE_ROOM:
            self.made_room(pod)
        started = time.time()
        # Label first, so that the gateway stops routing here before the drain begins. Any
        # wake progress left from before belongs to an older sleep. A wake asked while this
        # waits for its namespace's budget ends the sleep before it began.
        try:
            await self.label(
                pod,
                EngineState.DRAINING,
                engine,
                annotations={
                    SLEEP_STARTED_ANNOTATION: format_time(started),
                    WAKE_PROGRESS_ANNOTATION: None,
                },
                yield_to=engine.cancel,
            )
        except WriteYielded:
            log.info("%s/%s: a wake came before its drain began", self.namespace, pod.name)
            return
        engine.drain_started = started
        self.emit(
            "Normal", EventReason.DRAINING, f"{pod.name}: {why(action)}; draining before sleep"
        )
        deadline = started + self.settings.drain_timeout
        drained = False
        while time.time() < deadline and not engine.cancel.is_set():
            try:
                if (await client.activity()).in_flight == 0:
                    drained = True
                    break
            except EngineError:
                drained = True  # nothing is known to be in flight: the sleep says what is wrong
                break
            with contextlib.suppress(TimeoutError):  # not wait_for: see ModelLoop.run
                async with asyncio.timeout(self.settings.drain_poll):
                    await engine.cancel.wait()
        if not engine.cancel.is_set() and action.drained_only and not drained:
            await self._give_up_drain(pod, engine, spec.engine.kind)
            return
        if not engine.cancel.is_set() and spec.wake.verify:
            # Before the engine's first sleep (once per run): what its wakes are checked against.
            # The weights' digests take seconds: never while a wake waits for this room.
            await record_unless_woken(
                self.verifier,
                client.base_url,
                spec.model_name or self.model,
                engine,
                process_of(pod, spec.engine.port),
                weights=action.reason != ActionReason.MAKE_ROOM,
                timeout=self.settings.record_timeout,
                where=f"{self.namespace}/{pod.name}",
            )
        if engine.cancel.is_set():
            with urgent():  # a wake is asked: published at once
                await self.label(pod, EngineState.AWAKE, engine)
            self.emit(
                "Normal",
                EventReason.SLEEP_CANCELLED,
                f"{pod.name}: sleep cancelled, the model is wanted",
            )
            return
        level = action.level or spec.sleep.level
        # Marked before it is sent: an operator restarted from here on waits for this sleep
        # to end rather than sending another (or resumes the drain, if the mark is missing).
        await self.patch_pod(
            pod, engine, {"annotations": {SLEEP_SENT_ANNOTATION: format_time(time.time())}}
        )
        try:
            await client.sleep(level, "wait", timeout=sleep_timeout(spec, self.settings))
            if not await client.is_sleeping():
                raise EngineError(
                    "the engine answered /sleep but still says it is awake", url=client.base_url
                )
        except EngineError as exc:
            engine.busy = False
            engine.sleep_failures += 1
            engine.last_sleep_failure = time.time()
            engine.sleep_failure_reason, engine.sleep_failure_message = exc.reason, str(exc)
            self.metrics.sleep_failures.labels(self.namespace, self.model, exc.reason).inc()
            if isinstance(exc, SleepModeDisabledError):
                # No sleep route: the engine did not sleep, and no retry will make it. It
                # serves on, and is not asked again until its pod or the spec changes.
                engine.sleep_blocked = (pod.uid, self.memory.generation)
                engine.drain_started = None  # its mark is cleared with the pod's below
                await self.label(pod, EngineState.AWAKE, engine, annotations=UNMARKED)
                self.emit(
                    "Warning",
                    EventReason.SLEEP_FAILED,
                    f"{pod.name}: cannot sleep, so it stays awake and keeps serving; Snooze "
                    f"tries again once the pod is replaced or the spec changes. {exc}",
                )
                return
            sleeping = await _sleeping_or_none(client)
            if sleeping is not None:
                engine.believe(
                    sleeping, AFTER_SLEEP, process_of(pod, spec.engine.port), time.time()
                )
                await self.label(pod, EngineState.ASLEEP if sleeping else EngineState.AWAKE, engine)
            # An engine that does not answer stays `draining`, not routable: it may be frozen,
            # or still freeing its memory. The loop publishes it once a probe says which.
            delay = retry_delay(engine.sleep_failures)
            self.emit(
                "Warning",
                EventReason.SLEEP_FAILED,
                f"{pod.name}: sleep failed ({exc.reason}), next try in {delay:.0f}s at the "
                f"earliest: {exc}",
            )
            return
        engine.sleep_failures, engine.last_sleep_failure = 0, None
        engine.sleep_failure_reason = engine.sleep_failure_message = ""
        finished = time.time()
        # The level is kept on the pod: the wake must follow it, even after a restart of
        # the operator, and even where the engine does not publish its sleep state.
        await self.label(
            pod, EngineState.ASLEEP, engine, annotations={SLEEP_LEVEL_ANNOTATION: str(level)}
        )
        engine.sleep_level = level
        # What the next probe would say: a GPU pool counts on it now.
        engine.believe(True, AFTER_SLEEP, process_of(pod, spec.engine.port), finished)
        if level == 1:
            engine.note_host_copy(process_of(pod, spec.engine.port))
        self.memory.last_sleep_time = finished
        self.metrics.tier_transitions.labels(self.namespace, self.model, Phase.ASLEEP).inc()
        self.metrics.sleep_duration.labels(self.namespace, str(level)).observe(finished - started)
        self.emit(
            "Normal",
            EventReason.SLEPT,
            f"{pod.name}: asleep at level {level} after {finished - started:.2f}s ({why(action)})",
        )

    async def _wake(
        self, action: Action, pod: PodInfo, spec: InferenceModelSpec, engine: EngineMemory
    ) -> None:
        client = self._client(spec, pod, engine)
        level = action.level or spec.sleep.level
        await self.label(pod, EngineState.WAKING, engine)
        self.emit(
            "Normal", EventReason.WAKING, f"{pod.name}: waking from level {level} ({why(action)})"
        )
        started = time.monotonic()
        done = set(pod.wake_steps)
        if done:
            log.info("%s/%s: resuming a wake, steps done: %s", self.namespace, pod.name, done)

        async def record(step: str) -> None:
            # Only steps worth skipping on a resume are recorded (a reload takes tens of
            # seconds on vLLM); the last step is followed by the awake label anyway.
            done.add(step)
            if step in (WEIGHTS, RELOAD):
                progress = ",".join(sorted(done))
                await self.patch_pod(
                    pod, engine, {"annotations": {WAKE_PROGRESS_ANNOTATION: progress}}
                )

        checked = False
        try:
            await client.wake(level, timeout=spec.wake_timeout_seconds, done=done, on_step=record)
            if await client.is_sleeping():
                raise EngineError(
                    "the engine answered /wake_up but still says it sleeps", url=client.base_url
                )
            checked = await self.gate.checked(pod, spec, engine)
        except EngineError as exc:
            pool = self.pool_of(pod)
            said = str(exc)
            if isinstance(exc, OutOfMemoryError) and pool is not None:
                self.metrics.pool_oom.labels(self.namespace, pool).inc()
                # Its pool had counted room for it: another member holds more than it says,
                # not an engine outside the pool.
                said = (
                    f"{exc.url} ran out of device memory waking up, where GPUPool {pool} had "
                    "counted room for it: a member of the pool holds memory its sleep should "
                    "have given back (the pool's MemoryNotFreed Event names it, and the pool "
                    f"makes room without it). vLLM said: {exc.message!r}"
                )
            sleeping = await _sleeping_or_none(client)
            if sleeping is not None:
                engine.believe(sleeping, AFTER_WAKE, process_of(pod, spec.engine.port), time.time())
            if sleeping is not False:
                # Asleep, or not answering: not routable; the loop publishes what a probe says
                # (an engine found awake then is checked before it serves: _label_action).
                self.gate.count_failure(pod, spec, engine, exc.reason, said)
                await self.label(pod, EngineState.ASLEEP, engine)
                self.gate.tell_failure(pod, spec, engine, exc.reason, said)
                return
            # Awake though its wake failed: a step answered after the engine woke, or a release
            # woke everything at its first step (before 0.8.3 /wake_up reads no tags). It
            # serves only if its answer was checked, and is as before its sleep.
            checked = await self.gate.checked_after_failed_wake(pod, spec, engine, exc.reason, said)
        if not checked:
            return  # it woke answering differently: failed, never published awake
        seconds = time.monotonic() - started
        now = time.time()
        engine.wake_failures, engine.failed_wake_run = 0, None
        engine.last_failure = None
        engine.last_failure_reason = engine.last_failure_message = ""
        # A woken engine starts a fresh idle period: it was woken because it is wanted.
        engine.last_activity = now
        self.memory.last_activity = now
        await self.label(
            pod, EngineState.AWAKE, engine, annotations={WAKE_PROGRESS_ANNOTATION: None}
        )
        self.memory.last_wake_time = now
        self.memory.last_wake_seconds = seconds
        self.memory.failure = None
        self.metrics.tier_transitions.labels(self.namespace, self.model, Phase.AWAKE).inc()
        engine.sleep_level = 0
        # Its pool counts its footprint from now, not from a probe.
        engine.believe(False, AFTER_WAKE, process_of(pod, spec.engine.port), now)
        self.metrics.observe_wake(self.namespace, self.model, str(level), seconds)
        self.emit(
            "Normal", EventReason.WOKE, f"{pod.name}: awake after {seconds:.2f}s ({why(action)})"
        )
        if level == 2 and spec.wake.verify:
            # A level-2 wake reloaded the weights: their digests are compared once the engine
            # serves (the check takes seconds; no request waits for it).
            weights = await self.verifier.weights_after_wake(
                client.base_url, engine, process_of(pod, spec.engine.port)
            )
            if weights is not None and weights.failed:
                await self.gate.failed_check(
                    pod, spec, engine, FailureReason.WEIGHTS_MISMATCH, weights.message
                )

    async def _give_up_drain(self, pod: PodInfo, engine: EngineMemory, kind: str) -> None:
        """A drain that timed out on an engine that a /sleep with requests in flight would
        kill (a known vLLM bug; every SGLang server's release): it stays awake and serves;
        the next try backs off."""
        engine.busy = False
        engine.sleep_failures += 1
        engine.last_sleep_failure = time.time()
        engine.sleep_failure_reason = FailureReason.KNOWN_BUG
        crash = (
            "an SGLang server dies of a release with a request running: not released"
            if kind == "sglang"
            else "this vLLM release and configuration crash on a /sleep with requests in "
            "flight (see the KnownBug condition): not sent"
        )
        engine.sleep_failure_message = (
            f"requests were still in flight after {self.settings.drain_timeout:g}s of "
            f"draining, and {crash}"
        )
        self.metrics.sleep_failures.labels(
            self.namespace, self.model, FailureReason.KNOWN_BUG
        ).inc()
        engine.drain_started = None
        await self.label(pod, EngineState.AWAKE, engine, annotations=UNMARKED)
        delay = retry_delay(engine.sleep_failures)
        self.emit(
            "Warning",
            EventReason.SLEEP_FAILED,
            f"{pod.name}: {engine.sleep_failure_message}; it stays awake and serves, next try "
            f"in {delay:.0f}s at the earliest",
        )


async def _busy(client: SleepingEngine) -> bool:
    try:
        return (await client.activity()).in_flight > 0
    except EngineError:
        return False  # the sleep below says what is wrong


async def _sleeping_or_none(client: SleepingEngine) -> bool | None:
    try:
        return await client.is_sleeping()
    except EngineError:
        return None
