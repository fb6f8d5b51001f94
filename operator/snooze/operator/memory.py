"""What the operator remembers of each engine between probes, and how a restart rebuilds it.

Everything here can be lost: it is rebuilt from the model's status (activity, failures, the
last wake) and from the engines and pod labels themselves.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from snooze.api.conditions import ConditionType
from snooze.api.models import EngineState
from snooze.api.modelstatus import InferenceModelStatus, PodState, PodStatus
from snooze.api.reasons import FailureReason
from snooze.api.times import seconds_of
from snooze.engine.sglangfacts import SGLangFacts
from snooze.kube.pods import PodInfo
from snooze.policy.brakes import Brake, Claim, acted
from snooze.policy.integrity import Answer, Check
from snooze.policy.knownbugs import Conduct
from snooze.policy.pool.decision import RECENT_WINDOW_SECONDS
from snooze.policy.probing import Ledger
from snooze.policy.runs import Process

# One failed probe can be a hiccup (a busy node, a GC pause); two in a row, an interval apart,
# mean the engine is gone, frozen or never started: its status stops saying it is awake, so
# the gateway stops sending it requests until a probe gets an answer again.
UNREACHABLE_AFTER = 2


def process_of(pod: PodInfo, port: int | None) -> Process:
    """The run of the engine serving on `port` in `pod` (None: the port is not known)."""
    return Process(pod.uid, None if port is None else pod.engine_restarts(port))


def outstanding_of(pod: PodInfo, process: Process) -> frozenset[str]:
    """What the pod says the operator released or paused on its SGLang server's current run
    (nothing when it was written for an earlier run: a restarted server holds all its memory,
    unpaused)."""
    if pod.released is None:
        return frozenset()
    restarts, tags = pod.released
    return tags if Process(process.pod_uid, restarts).same_as(process) else frozenset()


@dataclass(kw_only=True)
class Integrity:
    """What one engine process was recorded as before its first sleep, and where its checks
    stand (operator/model/verification.py). Kept on the model's status, which only the operator
    writes, so that a restarted operator still checks the next wake."""

    process: Process | None = None
    """The engine run these records are of; another run starts over."""
    output: Check = Check.PENDING
    weights: Check = Check.PENDING
    baseline: Answer | None = None
    """Its greedy answer before its first sleep."""
    weights_digest: str | None = None
    """The digest of all its weights' digests (policy/integrity.py's weights_verdict)."""
    weights_count: int = 0
    weights_full: dict[str, str] | None = None
    """Every tensor's digest: in this process's memory only (too large for the status); it
    names the tensors that differ."""
    route: str | None = None
    """The route its greedy answer came on (the chat route for a model without completions)."""
    message: str = ""
    """Why a check is not Recorded or Verified, when that is worth saying."""
    quarantined: bool = False
    """It woke answering, or weighing, differently: never routed to again in this process."""
    output_given_up: bool = False
    weights_given_up: bool = False
    """Asking failed for a reason this run of the engine will give again (an answer too large
    or unreadable, a refusal such as a missing API key): not asked again until it restarts."""

    def of(self, process: Process) -> bool:
        """These records are of that run."""
        return self.process is not None and self.process.same_as(process)


@dataclass(kw_only=True)
class EngineMemory:
    """One engine (pod) as the operator has followed it."""

    last_activity: float
    uid: str = ""
    """The pod's uid: a pod recreated under the same name (a StatefulSet's) is a new engine,
    with nothing of the old one's failures."""
    deleted: bool = False
    """This process deleted the pod (wake.onFailure: Restart): until the pod index hears of
    it, the pod is not acted on again (it was restarted twice, counted twice)."""
    success_total: float | None = None
    """The success counter at the last probe: a change means requests finished."""
    busy: bool = False
    task: asyncio.Task[None] | None = None
    """The action in flight on this engine, if any: never more than one."""
    action: str = ""
    """The kind of that action (policy.sleep.ActionKind's value)."""
    cancel: asyncio.Event = field(default_factory=asyncio.Event)
    """Set to stop a drain before its sleep is sent."""
    wake_failures: int = 0
    last_failure: float | None = None
    last_failure_reason: str = ""
    last_failure_message: str = ""
    state_since: dict[str, float] = field(default_factory=dict)
    """When the pod entered its current published state, keyed by that state."""
    published: EngineState | None = None
    """The label this operator process last wrote on the pod (its index may lag behind)."""
    gate: tuple[bool, str] | None = None
    """The snooze.dev/awake condition this process last wrote on the pod, (status is "True",
    reason): its index may lag behind."""
    written_version: str = ""
    """The pod's resourceVersion that this process's last write of it made."""
    stale_versions: deque[str] = field(default_factory=lambda: deque(maxlen=8))
    """Versions of the pod from before that write: the one each write was decided on, and
    those earlier writes made. A pod index that still shows one of them has not seen the last
    write yet (a later version, this process's or anyone's, is the truth)."""
    sleeping: bool | None = None
    """The engine's own answer at the last probe, as believed (None: no answer): a claim that
    contradicts the last one with no sleep or wake between them waits for the brake's hold."""
    brake: Brake = field(default_factory=Brake)
    """How far its claims are trusted (policy/brakes.py)."""
    prompted: bool = False
    """A sleep or wake of Snooze's ran since the last claim believed: the next one may differ."""
    woke_at: float | None = None
    """When its pod was last published awake: a wake request older than that was answered."""
    answered: bool = False
    """It has answered a probe since the operator first saw its pod."""
    last_probe: float | None = None
    """When it was last probed (None: never, or an action since wants it confirmed)."""
    stalls_seen: float = 0.0
    """The gateways' count of its stalls at its last probe: a larger count asks for one."""
    busy_at: float | None = None
    """When a check before a sleep last found it busy (kept apart from last_probe, which the
    action's end clears): a fact newer than a scrape of the gateway's counters may be."""
    direct_activity: bool = False
    """Its last probe found activity that the gateway's counters do not account for."""
    ledger: Ledger | None = None
    """Its finished requests against those the gateway sent it (policy/probing.py)."""
    sleep_level: int | None = None
    """The level it sleeps at, as it last said (vllm:engine_sleep_state) or as the operator
    put it to sleep."""
    sleeps_in_flight: int | None = None
    """Sleeps the engine said it was carrying out at the last probe (vLLM 0.32+)."""
    gpu_share: float | None = None
    """Its share of the device (vllm:cache_config_info's gpu_memory_utilization), if said."""
    probe_failures: int = 0
    """Probes in a row that got no answer; at UNREACHABLE_AFTER the engine counts as unreachable."""
    probe_error: str = ""
    """What the last failed probe met (names the URL it tried)."""
    unanswered_since: float | None = None
    """When the first of the probes in a row that got no answer failed."""
    host_copy: Process | None = None
    """The engine process last seen asleep at level 1; None: never seen so. See
    holds_host_copy."""
    sleep_failures: int = 0
    """Failed sleeps in a row: each backs the next try off, as failed wakes do."""
    last_sleep_failure: float | None = None
    sleep_failure_reason: str = ""
    sleep_failure_message: str = ""
    drain_started: float | None = None
    """When this process began the engine's latest drain (the mark it wrote on the pod)."""
    sleep_blocked: tuple[str, int | None] | None = None
    level_told: tuple[Process, int, int | None] | None = None
    """The engine run, the spec's level and generation last told that an SGLang server's flags
    make another level (said once for each)."""
    """(pod uid, spec generation) at which the engine was found unable to sleep at all (no
    sleep mode): no sleep is tried again until the pod or the spec changes."""
    served: deque[tuple[float, float]] = field(default_factory=deque)
    """(probe time, requests finished since the previous probe) over the last RECENT_WINDOW
    seconds: how often it is asked for, which a GPU pool's Cheapest order weighs."""
    integrity: Integrity = field(default_factory=Integrity)
    recording: asyncio.Task[None] | None = None
    """Its weights' digests under way, which a wake no longer waited for (model/firstrecord.py)."""
    conduct: Conduct | None = None
    """How it sleeps given the known vLLM bugs its release and arguments are in (its last
    cycle's reading: the KnownBug condition says it)."""
    sleeps_at: dict[int, int | None] = field(default_factory=dict)
    """The level it sleeps at for each level a pool may ask (operator/model/knownbugs.py); empty
    until its first cycle."""
    version: tuple[Process, str] | None = None
    """(engine run, its vLLM version from /version), asked once per run."""
    failed_wake_run: Process | None = None
    """The run of the engine whose last wake failed: while it runs, it is published again only
    once its answer was checked and matched (operator/model/wakegate.py)."""
    version_failures: int = 0
    version_retry_at: float = 0.0
    """Asks of /version that failed in a row, and when it may be asked again (backing off)."""
    server_info: tuple[Process, SGLangFacts] | None = None
    """(engine run, what its /server_info says) of an SGLang server, asked once per run."""

    def believe(self, sleeping: bool, source: str, process: Process, now: float) -> None:
        """Snooze's own sleep or wake made it say `sleeping` (by `source`): believed."""
        self.brake = acted(
            self.brake, Claim(sleeping=sleeping, at=now, source=source), process=process
        )
        self.sleeping, self.prompted = sleeping, False

    def note_host_copy(self, process: Process) -> None:
        """It is asleep at level 1: its process holds a pinned copy of its weights from now
        until it ends (PyTorch's caching host allocator keeps the blocks after the wake)."""
        self.host_copy = process

    def holds_host_copy(self, process: Process) -> bool:
        """That process still runs, so it still holds the copy."""
        return self.host_copy is not None and self.host_copy.same_as(process)

    def note_served(self, total: float, now: float) -> None:
        """Count what its success counter moved by since the last probe (an engine that
        restarted counts from zero) and forget what is older than the window."""
        before = self.success_total
        finished = total if before is None or total < before else total - before
        if before is not None and finished > 0:
            self.served.append((now, finished))
        while self.served and self.served[0][0] <= now - RECENT_WINDOW_SECONDS:
            self.served.popleft()

    def recent_requests(self, now: float) -> int:
        """Requests it finished in the last RECENT_WINDOW_SECONDS."""
        since = now - RECENT_WINDOW_SECONDS
        return round(sum(n for at, n in self.served if at > since))

    def stop(self) -> None:
        """Cancel what runs for it: its step, and digests that no step waits for."""
        for task in (self.task, self.recording):
            if task is not None and not task.done():
                task.cancel()

    @property
    def unreachable(self) -> bool:
        return self.probe_failures >= UNREACHABLE_AFTER

    @property
    def acting(self) -> bool:
        return self.task is not None and not self.task.done()

    def saw_busy(self, now: float) -> None:
        """A check of the engine itself found requests running or waiting now."""
        self.busy = True
        self.last_activity = self.busy_at = now

    @property
    def acting_kind(self) -> str | None:
        return self.action if self.acting else None

    def wrote(self, *, before: str, after: str) -> None:
        """This process patched the pod, decided on version `before`, making `after`."""
        for version in (before, self.written_version):
            if version and version != after and version not in self.stale_versions:
                self.stale_versions.append(version)
        self.written_version = after

    def sleep_started_of(self, pod: PodInfo) -> float | None:
        """When the engine's latest drain began: the pod's mark, or the mark this process wrote
        since, which the lagging pod index may not show yet. With the older mark, a wake request
        made after the previous sleep looked newer than this drain and cancelled it (a member a
        GPU pool was putting to sleep to make room stayed awake, and the wake it made room for
        waited for another choice)."""
        marks = [t for t in (pod.sleep_started, self.drain_started) if t is not None]
        return max(marks) if marks else None

    def label_of(self, pod: PodInfo) -> EngineState | None:
        """The pod's state label: the one this process wrote last, while the pod index still
        shows a version from before that write. Under load the index lags seconds behind the
        API, and reading the old label from it made the loop write the same label again
        every cycle (thousands of pod patches in a sleep wave of 2,000 engines)."""
        if (
            self.published is not None
            and pod.resource_version
            and pod.resource_version in self.stale_versions
        ):
            return self.published
        return pod.state

    def gate_of(self, pod: PodInfo) -> tuple[bool, str] | None:
        """The pod's snooze.dev/awake condition, read as label_of reads its label."""
        if self.gate is not None and pod.resource_version in self.stale_versions:
            return self.gate
        return pod.gate


@dataclass(kw_only=True)
class ModelMemory:
    """A model's engines and the model-level facts that outlive one probe."""

    engines: dict[str, EngineMemory] = field(default_factory=dict)
    last_sleep_time: float | None = None
    last_wake_time: float | None = None
    last_wake_seconds: float | None = None
    last_activity: float | None = None
    """The model's latest real activity (requests, or a wake), across every engine it has had:
    engines go at zero replicas, and new pods are not activity."""
    answered: bool = False
    """One of its engines has answered a probe in this run: its idle clock (and so its
    scaleToZeroAfter) runs from then, not from when the model was first seen."""
    scaled_from: int | None = None
    """Replicas to restore: set while Snooze holds the workload at zero."""
    scaled_at: float | None = None
    manual_at: float | None = None
    scale_up_time: float | None = None
    """When Snooze scaled the workload back up, until an engine answers."""
    failure: tuple[str, str, str] | None = None
    """(pod, reason, message) of the last failed wake, until a wake succeeds: it outlives a
    pod restarted to remedy it, so WakeFailed says what happened."""
    poke: asyncio.Event = field(default_factory=asyncio.Event)
    """Set to run the next cycle now rather than at the next probe interval."""
    generation: int | None = None
    """The spec generation the current cycle acts on."""

    def engine(self, pod: str, *, now: float) -> EngineMemory:
        if pod not in self.engines:
            # A new engine's idle clock starts when the operator first sees it.
            self.engines[pod] = EngineMemory(last_activity=now)
        return self.engines[pod]

    def forget_missing(self, pods: Iterable[PodInfo]) -> None:
        """Forget engines whose pod is gone, or was replaced by a new one of the same name."""
        present = {p.name: p.uid for p in pods}
        for name, memory in list(self.engines.items()):
            uid = present.get(name)
            if uid is not None and (not memory.uid or not uid or memory.uid == uid):
                memory.uid = memory.uid or uid
                continue
            del self.engines[name]
            memory.stop()


def rebuild(
    status: InferenceModelStatus | None, *, unwritten: float = 0.0, now: float | None = None
) -> ModelMemory:
    """Memory as the last status recorded it: what an operator restarted mid-way starts from.

    Activity times are written at most once per status interval (`unwritten` seconds) while
    only they move, so an engine may have served requests up to that long after the status
    was last written: its activity counts as that recent (never later than `now`), so that a
    restart never sleeps an engine sooner than the operator before it would have."""
    memory = ModelMemory()
    if status is None:
        return memory
    written = _seconds(status.activity_written_time)
    unsure = None if written is None else written + unwritten
    if unsure is not None and now is not None:
        unsure = min(unsure, now)

    def activity_at_least(recorded: float | None) -> float | None:
        if recorded is None or unsure is None:
            return recorded
        return max(recorded, unsure)

    memory.last_sleep_time = _seconds(status.last_sleep_time)
    memory.last_wake_time = _seconds(status.last_wake_time)
    memory.last_wake_seconds = status.last_wake_seconds
    memory.last_activity = activity_at_least(_seconds(status.last_activity_time))
    memory.scaled_from = status.scaled_from_replicas
    memory.scaled_at = _seconds(status.scaled_to_zero_time)
    memory.manual_at = _seconds(status.manual_scale_time)
    memory.scale_up_time = _seconds(status.scale_up_time)
    blocked_generation = None
    for condition in status.conditions:
        if condition.type == ConditionType.WAKE_FAILED and condition.status == "True":
            pod, _, message = condition.message.partition(": ")
            memory.failure = (pod, condition.reason, message)
        if condition.type == ConditionType.SLEEP_FAILED and condition.status == "True":
            blocked_generation = condition.observed_generation
    for entry in status.pods:
        activity = activity_at_least(_seconds(entry.last_activity_time))
        if activity is None:
            continue
        # Known before the restart: its idle clock stands (one still loading starts it anew).
        engine = EngineMemory(
            last_activity=activity,
            answered=entry.state != PodState.UNREADY,
            uid=entry.uid,  # a pod recreated meanwhile is a new engine
        )
        engine.wake_failures = entry.wake_failures
        engine.last_failure_reason = entry.failure_reason
        engine.last_failure = _seconds(entry.last_failure_time)
        engine.sleep_failures = entry.sleep_failures
        engine.sleep_failure_reason = entry.sleep_failure_reason
        # The sleep failure that no retry can mend: the engine runs without sleep mode.
        if engine.sleep_failure_reason == FailureReason.SLEEP_MODE_DISABLED and entry.uid:
            engine.sleep_blocked = (entry.uid, blocked_generation)
        since = _seconds(entry.since)
        if since is not None and entry.state in {s.value for s in EngineState}:
            engine.state_since[entry.state] = since
        if since is not None and entry.state == EngineState.AWAKE.value:
            engine.woke_at = since  # its last wake, as far as the status tells
        engine.integrity = integrity_of(entry)
        memory.engines[entry.name] = engine
    return memory


def integrity_of(entry: PodStatus) -> Integrity:
    """An engine's records as the status kept them (an entry the operator did not write, or
    an older release's, gives none: they are taken again at its next sleep)."""
    found = entry.verification
    if found is None or not entry.uid:
        return Integrity()
    integrity = Integrity(
        process=Process(entry.uid, found.restarts),
        output=_check(found.output),
        weights=_check(found.weights),
        weights_digest=found.weights_digest,
        weights_count=found.weight_tensors or 0,
        message=found.message,
    )
    baseline = found.baseline
    if baseline is not None:
        tokens = None if baseline.tokens is None else tuple(baseline.tokens)
        integrity.baseline = Answer(
            route=baseline.route, tokens=tokens, text_sha256=baseline.text_sha256
        )
        integrity.route = baseline.route
    integrity.quarantined = Check.MISMATCH in (integrity.output, integrity.weights)
    return integrity


def _seconds(moment: datetime | None) -> float | None:
    return None if moment is None else seconds_of(moment)


def _check(value: str) -> Check:
    try:
        return Check(value)
    except ValueError:
        return Check.PENDING
