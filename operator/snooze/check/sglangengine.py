"""The checks of one SGLang server (`snooze check --engine URL`): ask it what each check needs,
every request bounded (check/asking.py), then judge the answers (check/sglangjudge.py); with
--cycle, one release and resume through the operator's own SGLang client (engine/sglang.py)."""

from __future__ import annotations

import asyncio

from snooze.check import cycle, sglangjudge
from snooze.check.asking import Asked, ask
from snooze.check.cycle import EngineOptions
from snooze.check.report import Kind, Level, Result, Subject, failure
from snooze.check.vllmjudge import PodSeen
from snooze.engine.activity import METRICS_LIMIT, ActivitySnapshot
from snooze.engine.errors import EngineError
from snooze.engine.http import EngineHttp
from snooze.engine.sglang import SGLangClient, weight_checksums
from snooze.engine.sglangfacts import PROBE_METRICS, SGLangFacts

NAME = "SGLang"
SERVER_INFO_LIMIT = 1 << 20
"""/server_info: the server's arguments, flattened; a few kB."""
PATHS = ("/server_info", "/get_server_info")
"""/server_info from 0.5.6; /get_server_info in every release (deprecated from 0.5.6)."""


async def identify(http: EngineHttp, url: str, timeout: float) -> tuple[str | None, Asked]:  # noqa: ASYNC109
    """The release an SGLang server says at /server_info (None: not an SGLang server; "": one
    that wants a key to say it), and its answer."""
    asked = Asked()
    for path in PATHS:
        asked = await ask(http, "GET", url + path, timeout=timeout, limit=SERVER_INFO_LIMIT)
        if asked.status != 404:
            break
    if sglangjudge.wants_key(asked):
        return "", asked
    said = sglangjudge.server_said(asked)
    return (said.facts.version if said.facts is not None else None), asked


async def examine(
    http: EngineHttp,
    url: str,
    info_answer: Asked,
    *,
    pod: PodSeen | None,
    options: EngineOptions,
) -> list[Result]:
    """Every check of an SGLang server whose /server_info answered `info_answer`."""
    subject = Subject(kind=Kind.ENGINE, name=url)
    said = sglangjudge.server_said(info_answer)
    facts = said.facts
    if facts is None:
        return [sglangjudge.keyed(subject, url, info_answer, PATHS[0])]
    path = PATHS[0] if facts.release >= (0, 5, 6) else PATHS[1]
    first = sglangjudge.engine(subject, url, facts, path)
    if first.level is Level.FAILURE:
        return [first, *([sglangjudge.pod_read(subject, pod)] if pod is not None else [])]
    timeout = options.timeout
    query = [("name[]", name) for name in PROBE_METRICS]
    probed, filtered, whole = await asyncio.gather(
        _probe(http, url, facts, timeout),
        ask(http, "GET", url + "/metrics", params=query, timeout=timeout, limit=METRICS_LIMIT),
        ask(http, "GET", url + "/metrics", timeout=timeout, limit=METRICS_LIMIT),
    )
    activity, probe_failure = probed
    results = [
        first,
        sglangjudge.api_keys(subject, said.keys),
        sglangjudge.memory_saver(subject, facts),
        sglangjudge.cpu_backup(subject, facts),
        *([sglangjudge.pod_read(subject, pod)] if pod is not None else []),
        sglangjudge.known_bugs(subject, facts),
        sglangjudge.weight_checker(subject, facts),
        sglangjudge.metrics(subject, facts, activity, probe_failure, filtered, whole),
    ]
    if options.cycle is None:
        return results
    if any(r.level is Level.FAILURE for r in results):
        failed = ", ".join(r.check for r in results if r.level is Level.FAILURE)
        results.append(
            failure(
                subject,
                "cycle-sleep",
                f"not run: Snooze never puts this server to sleep while these lines fail: {failed}",
                "fix those, then run --cycle again",
            )
        )
        return results
    ready = (
        await ask(http, "GET", url + "/ready", timeout=timeout)
        if facts.release >= sglangjudge.READY_FROM
        else None
    )
    paused = sglangjudge.paused(ready, pod is not None and pod.released)
    if paused is not None:
        results.append(
            failure(
                subject,
                "cycle-sleep",
                f"not run: {paused}, and a second release kills an SGLang server",
                "run --cycle on an awake server that no operator manages (or set its "
                "InferenceModel's desiredState: Awake first)",
            )
        )
        return results
    before = cycle.Before(sleeping=False, activity=activity, facts=sglangjudge.serve_facts(facts))
    options_here = cycle.CycleOptions(
        level=options.cycle.level,
        timeout=options.cycle.timeout,
        force=options.cycle.force,
        model=options.cycle.model,
        checker=facts.checksums,
    )
    steps = _steps(http, url, facts, timeout)
    return results + await cycle.run(subject, http, url, before, options_here, steps)


def _steps(http: EngineHttp, url: str, facts: SGLangFacts, timeout: float) -> cycle.Steps:
    """An SGLang server's cycle, through the operator's client: pause, check the scheduler is
    empty, release every tag; resume (and reload at level 2), continue."""
    client = SGLangClient(url, client=http, timeout=timeout, facts=facts)

    async def not_asleep() -> str | None:
        # SGLang keeps no sleep state; from 0.5.20 /ready says whether generation is paused.
        if facts.release < sglangjudge.READY_FROM:
            return None
        asked = await ask(http, "GET", url + "/ready", timeout=timeout)
        return "/ready answers 200: generation is not paused" if asked.status == 200 else None

    async def checksums() -> dict[str, str] | None:
        return await weight_checksums(http, url, timeout=cycle.CHECKSUM_TIMEOUT)

    return cycle.Steps(
        sleep=lambda level, seconds: client.sleep(level, timeout=seconds),
        not_asleep=not_asleep,
        wake=lambda level, seconds: client.wake(level, timeout=seconds),
        checksums=checksums,
        sleep_fix="read the server's log; where nothing was released and it no longer serves, "
        f"POST {url}/continue_generation; else restart its pod",
        wake_fix=f"the server may be left released: POST {url}/resume_memory_occupation with "
        "the tags released, then /continue_generation, or restart its pod",
    )


async def _probe(
    http: EngineHttp,
    url: str,
    facts: SGLangFacts,
    timeout: float,  # noqa: ASYNC109
) -> tuple[ActivitySnapshot | None, str]:
    """The operator's own probe of the server: what it would read, or why it could not."""
    client = SGLangClient(url, client=http, timeout=timeout, facts=facts)
    try:
        return await client.activity(), ""
    except EngineError as exc:
        return None, str(exc)
