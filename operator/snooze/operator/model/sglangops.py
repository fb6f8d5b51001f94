"""What a model's loop does differently for SGLang servers: it learns each server's arguments
once per run (/server_info), reads the sleep state it keeps on the pod (SGLang keeps none that
can be read), probes SGLang's metrics, and never puts to sleep a server that cannot sleep."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Hashable, Iterable

from snooze.api.eventreasons import EventReason
from snooze.api.reasons import FailureReason
from snooze.engine.errors import EngineError, EngineHTTPError
from snooze.engine.http import EngineHttp
from snooze.engine.probe import Prober
from snooze.engine.sglang import SGLangClient
from snooze.engine.sglangfacts import SGLangFacts
from snooze.kube.pods import PodInfo
from snooze.operator.events.emit import Emit
from snooze.operator.memory import EngineMemory, outstanding_of
from snooze.operator.model.observe import Probe
from snooze.policy.knownbugs import SGLANG, ServeFacts, sglang_level, sglang_refusal
from snooze.policy.runs import Process

log = logging.getLogger(__name__)
INFO_TIMEOUT = 5.0
REFUSED = FailureReason.SLEEP_MODE_DISABLED
__all__ = [
    "learn_server_info",
    "note_level",
    "note_refusal",
    "outstanding_of",
    "probe",
    "serve_facts",
]


def facts_of(engine: EngineMemory, process: Process) -> SGLangFacts | None:
    """The server's arguments as read during this run, if they were."""
    known = engine.server_info
    return known[1] if known is not None and known[0].same_as(process) else None


def serve_facts(engine: EngineMemory, process: Process) -> ServeFacts:
    """What the known-bug table reads of an SGLang server: what its /server_info said."""
    facts = facts_of(engine, process)
    if facts is None:
        return ServeFacts(engine=SGLANG)
    return ServeFacts(
        engine=SGLANG,
        version=facts.version,
        tensor_parallel=facts.tensor_parallel,
        host_copy=facts.host_copy,
    )


async def learn_server_info(
    http: EngineHttp, targets: Iterable[tuple[str, EngineMemory, Process]]
) -> None:
    """Ask /server_info of each server whose run has not said it yet: once per run; a failure
    is asked again at the next cycle (meanwhile the server is not put to sleep)."""

    async def ask(url: str, engine: EngineMemory, process: Process) -> None:
        try:
            facts = await SGLangClient(url, client=http, timeout=INFO_TIMEOUT).facts()
        except EngineError as exc:
            log.debug("asking %s/server_info failed: %s", url, exc)
            return
        engine.server_info = (process, facts)

    await asyncio.gather(*(ask(url, e, p) for url, e, p in targets if facts_of(e, p) is None))


def note_refusal(
    pod: PodInfo, engine: EngineMemory, process: Process, generation: int | None, emit: Emit
) -> None:
    """A server that cannot sleep (no memory saver, no metrics, no /pause_generation) is kept
    awake, never drained, with a SleepFailed condition naming what to change; said once per
    pod and spec."""
    facts = facts_of(engine, process)
    if facts is None:
        return
    why = sglang_refusal(
        version=facts.version, memory_saver=facts.memory_saver, metrics=facts.metrics
    )
    blocked = (pod.uid, generation)
    if why is None or engine.sleep_blocked == blocked:
        return
    engine.sleep_blocked = blocked
    engine.sleep_failures = max(engine.sleep_failures, 1)
    engine.sleep_failure_reason, engine.sleep_failure_message = REFUSED, why
    emit("Warning", EventReason.SLEEP_FAILED, f"{pod.name}: never put to sleep: {why}")


def note_level(
    pod: PodInfo,
    engine: EngineMemory,
    process: Process,
    level: int,
    generation: int | None,
    emit: Emit,
) -> None:
    """A server whose flags make another level than spec.sleep.level asks sleeps at its own
    (whether a release keeps a host copy is its flag, not the call's): said once per run, spec
    level and generation, with what to change, so that a spec is never quietly overruled."""
    facts = facts_of(engine, process)
    own = None if facts is None else sglang_level(facts.host_copy)
    told = (process, level, generation)
    if own is None or own == level or engine.level_told == told:
        return
    engine.level_told = told
    if own == 1:
        how, change = "with --enable-weights-cpu-backup: it keeps a host copy", "remove the flag"
    else:
        how = "without --enable-weights-cpu-backup: its weights are reloaded at each wake"
        change = "add the flag"
    emit(
        "Warning",
        EventReason.SERVER_SETS_LEVEL,
        f"{pod.name}: sleeps at level {own}, not the level {level} spec.sleep.level asks: an "
        f"SGLang server's level is its own flag, and it runs {how}. Set spec.sleep.level: "
        f"{own}, or {change}",
    )


async def probe(
    prober: Prober,
    url: str,
    pod: str,
    *,
    outstanding: frozenset[str],
    urgent: bool = False,
    owner: Hashable = None,
) -> Probe:
    """A filtered scrape of SGLang's metrics; asleep is what the pod says the operator
    released. A server without --enable-metrics still answers (404): it counts as reachable
    with its activity unknown (only the gateway's counts), and is never put to sleep."""
    sleeping = bool(outstanding)
    try:
        activity = await prober.sglang_activity(url, urgent=urgent, owner=owner)
    except EngineHTTPError as exc:
        if exc.status == 404:
            return Probe(pod=pod, sleeping=sleeping)
        log.debug("probe of %s failed: %s", pod, exc)
        return Probe(pod=pod, sleeping=None, error=str(exc), reason=exc.reason)
    except EngineError as exc:
        log.debug("probe of %s failed: %s", pod, exc)
        return Probe(pod=pod, sleeping=None, error=str(exc), reason=exc.reason)
    return Probe(
        pod=pod,
        sleeping=sleeping,
        in_flight=activity.in_flight,
        success_total=activity.success_total,
    )
