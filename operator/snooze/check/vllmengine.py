"""The checks of one vLLM engine (`snooze check --engine URL`): ask it what each check needs,
every request bounded (check/asking.py), then judge the answers (check/vllmjudge.py)."""

from __future__ import annotations

import asyncio

from snooze.check import cycle, vllmjudge
from snooze.check.asking import Asked, ask
from snooze.check.cycle import EngineOptions
from snooze.check.report import Kind, Level, Result, Subject, failure, ok
from snooze.check.vllmjudge import PodSeen
from snooze.engine.activity import ACTIVITY_METRICS, METRICS_LIMIT, ActivitySnapshot
from snooze.engine.errors import EngineError
from snooze.engine.http import EngineHttp
from snooze.engine.metricspath import FILTERING, PLAIN
from snooze.engine.probe import Prober
from snooze.policy.knownbugs import ServeFacts

NAME = "vLLM"
SERVER_INFO_LIMIT = 4 << 20
"""/server_info holds the whole configuration and the host's environment: tens of kB."""
SERVER_INFO_TIMES = 3
"""/server_info's first answer collects the host's environment (in a thread, for seconds): it
may take this many times what another request may."""


async def identify(http: EngineHttp, url: str, timeout: float) -> tuple[str | None, Asked]:  # noqa: ASYNC109
    """The release a vLLM engine says at /version (None: not a vLLM), and its answer."""
    asked = await ask(http, "GET", url + "/version", timeout=timeout)
    return vllmjudge.version_of(asked), asked


async def examine(
    http: EngineHttp,
    url: str,
    version_answer: Asked,
    *,
    pod: PodSeen | None,
    options: EngineOptions,
) -> list[Result]:
    """Every check of a vLLM engine whose /version answered `version_answer`."""
    subject = Subject(kind=Kind.ENGINE, name=url)
    first = vllmjudge.engine(subject, url, version_answer)
    serve = [vllmjudge.serve_args_check(subject, pod)] if pod is not None else []
    version = first.data.get("version")
    if first.level is Level.FAILURE and version is None:
        return [first, *serve]
    timeout = options.timeout
    prober = Prober(limit=4, timeout=timeout)
    try:
        sleeping, info, checker, filtered, whole, probed = await asyncio.gather(
            ask(http, "GET", url + "/is_sleeping", timeout=timeout),
            ask(
                http,
                "GET",
                url + "/server_info",
                params={"config_format": "json"},
                timeout=timeout * SERVER_INFO_TIMES,
                limit=SERVER_INFO_LIMIT,
            ),
            # An empty body: the route refuses it (its `action` is required) before hashing.
            ask(http, "POST", url + "/weight_checker", json={}, timeout=timeout),
            _filtered_metrics(http, url, timeout),
            ask(http, "GET", url + PLAIN, timeout=timeout, limit=METRICS_LIMIT),
            _probe(prober, url),
        )
    finally:
        await prober.aclose()
    dev = vllmjudge.dev_mode(subject, sleeping, pod)
    config = vllmjudge.server_info(info)
    sleep = vllmjudge.sleep_mode(subject, config, pod, dev.level is Level.OK)
    bugs = vllmjudge.known_bugs(subject, version, config, pod)
    activity, probe_failure = probed
    results = [
        first,
        dev,
        sleep,
        *serve,
        bugs,
        vllmjudge.weight_checker(subject, checker, version),
        vllmjudge.metrics(subject, activity, probe_failure, filtered, whole, version),
    ]
    if options.cycle is None:
        return results
    if dev.level is Level.FAILURE or sleep.level is Level.FAILURE:
        results.append(
            failure(
                subject,
                "cycle-sleep",
                "not run: the dev-mode and sleep-mode lines above must pass first",
                "fix those, then run --cycle again",
            )
        )
        return results
    facts = vllmjudge.serve_facts(version, config, pod)[0] or ServeFacts(version=version)
    before = cycle.Before(sleeping=bool(dev.data.get("sleeping")), activity=activity, facts=facts)
    options_here = cycle.CycleOptions(
        level=options.cycle.level,
        timeout=options.cycle.timeout,
        force=options.cycle.force,
        model=options.cycle.model,
        checker=vllmjudge.checker_present(checker),
    )
    cycled = await cycle.run(subject, http, url, before, options_here)
    slept = any(r.check == "cycle-sleep" and r.level is Level.OK for r in cycled)
    if slept and sleep.level is not Level.OK:
        # Not known from its configuration, and now proven: it slept.
        results[results.index(sleep)] = ok(subject, "sleep-mode", "on: the cycle put it to sleep")
    return results + cycled


async def _filtered_metrics(http: EngineHttp, url: str, timeout: float) -> Asked:  # noqa: ASYNC109
    """The families Snooze reads, asked for where the operator's probe asks them
    (engine/metricspath.py): at /metrics/, where vLLM's filtering app answers, else at
    /metrics."""
    query = [("name[]", name) for name in ACTIVITY_METRICS]
    asked = await ask(
        http, "GET", url + FILTERING, params=query, timeout=timeout, limit=METRICS_LIMIT
    )
    if asked.status != 404:
        return asked
    return await ask(http, "GET", url + PLAIN, params=query, timeout=timeout, limit=METRICS_LIMIT)


async def _probe(prober: Prober, url: str) -> tuple[ActivitySnapshot | None, str]:
    """The operator's own probe of the engine: what it would read, or why it could not."""
    try:
        return await prober.activity(url), ""
    except EngineError as exc:
        return None, str(exc)
