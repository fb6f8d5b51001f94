"""Known vLLM bugs, as a model's loop meets them: each engine's release (asked once per run, and
only where its pod's arguments put it near a row of the table) and how it must sleep."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from snooze.api.models import InferenceModelSpec
from snooze.engine.errors import EngineError
from snooze.engine.http import EngineHttp
from snooze.engine.verify import version
from snooze.kube.pods import PodInfo
from snooze.operator.memory import EngineMemory
from snooze.policy.knownbugs import Conduct, ServeFacts, conduct, could_apply
from snooze.policy.runs import Process

log = logging.getLogger(__name__)
VERSION_TIMEOUT = 5.0


def facts_of(pod: PodInfo, engine: EngineMemory, process: Process) -> ServeFacts:
    """What the table reads: the pod's `vllm serve` arguments, and the engine's release if
    it was asked during this run."""
    known = engine.version
    return ServeFacts(
        version=known[1] if known is not None and known[0].same_as(process) else None,
        lora=pod.serve.lora,
        tensor_parallel=pod.serve.tensor_parallel,
        pipeline_parallel=pod.serve.pipeline_parallel,
    )


async def learn_versions(
    http: EngineHttp, targets: Iterable[tuple[str, EngineMemory, Process, ServeFacts]]
) -> None:
    """Ask /version of each engine that a row could concern and whose release this run has
    not said yet: (url, memory, run, facts) each. One request per engine run; a failure is
    asked again at the next cycle (meanwhile the rows apply, an unknown release not being
    safe)."""

    async def ask(url: str, engine: EngineMemory, process: Process) -> None:
        try:
            engine.version = (process, await version(http, url, timeout=VERSION_TIMEOUT))
        except EngineError as exc:
            log.debug("asking %s/version failed: %s", url, exc)

    await asyncio.gather(
        *(
            ask(url, engine, process)
            for url, engine, process, facts in targets
            if facts.version is None and could_apply(facts)
        )
    )


def conduct_of(spec: InferenceModelSpec, facts: ServeFacts, pool_level: int | None) -> Conduct:
    """How the engine sleeps: at the level its pool or spec wants, unless a row moves it."""
    return conduct(facts, pool_level or spec.sleep.level, spec.wake.on_known_bug)
