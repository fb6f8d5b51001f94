"""Known vLLM bugs, as a model's loop meets them: each engine's release (asked once per run) and
how it must sleep."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable

from snooze.api.models import InferenceModelSpec
from snooze.engine.errors import EngineError
from snooze.engine.http import EngineHttp
from snooze.engine.verify import version
from snooze.kube.pods import PodInfo
from snooze.operator.memory import EngineMemory
from snooze.policy.knownbugs import LEVELS, Conduct, ServeFacts, conduct
from snooze.policy.runs import Process

log = logging.getLogger(__name__)
VERSION_TIMEOUT = 5.0
# A /version that failed is asked again after 10 s, then twice as long each time, up to ten
# minutes: an engine that has none (not vLLM's server) is not asked at every probe.
RETRY_SECONDS, RETRY_MAX_SECONDS = 10.0, 600.0


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
    """Ask /version of each engine whose release this run has not said yet: (url, memory, run,
    facts) each. Every engine's is worth it: which level it can wake from, and which of its
    metrics appear only after a first sleep, depend on it. One request per engine run; a
    failure is asked again later, backing off (meanwhile the release is unknown, which is not
    safe: every row its arguments fit applies)."""
    now = time.time()

    async def ask(url: str, engine: EngineMemory, process: Process) -> None:
        try:
            engine.version = (process, await version(http, url, timeout=VERSION_TIMEOUT))
        except EngineError as exc:
            engine.version_failures += 1
            delay = RETRY_SECONDS * 2 ** (engine.version_failures - 1)
            engine.version_retry_at = now + min(delay, RETRY_MAX_SECONDS)
            log.debug("asking %s/version failed: %s", url, exc)
        else:
            engine.version_failures, engine.version_retry_at = 0, 0.0

    await asyncio.gather(
        *(
            ask(url, engine, process)
            for url, engine, process, facts in targets
            if facts.version is None and now >= engine.version_retry_at
        )
    )


def conduct_of(spec: InferenceModelSpec, facts: ServeFacts, pool_level: int | None) -> Conduct:
    """How the engine sleeps: at the level its pool or spec wants, unless a row moves it."""
    return conduct(facts, pool_level or spec.sleep.level, spec.wake.on_known_bug)


def sleeps_at(spec: InferenceModelSpec, facts: ServeFacts) -> dict[int, int | None]:
    """The level the engine sleeps at for each level a pool may ask (None: it stays awake),
    so that a pool counts the host RAM of a level-2 ask that comes to level 1."""
    return {level: conduct_of(spec, facts, level).level for level in LEVELS}
