"""What a vLLM engine's answers mean for Snooze, check by check: its release, its dev mode, its
sleep mode, the known bugs of the operator's table that apply to it, its weight checker and the
metrics the operator reads. Pure: answers in (check/asking.py's), results out."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from snooze.check.asking import Asked, answer_said, json_object, size, unfiltered
from snooze.check.report import Result, Subject, failure, ok, warning
from snooze.engine.activity import (
    ACTIVITY_METRICS,
    CACHE_CONFIG,
    OPERATIONS,
    SERIES_LIMIT,
    SLEEP_STATE,
    ActivitySnapshot,
)
from snooze.engine.exposition import samples
from snooze.kube.serveargs import ServeArgs, serve_args
from snooze.policy import knownbugs
from snooze.policy.knownbugs import VLLM, ServeFacts, format_release, release_of

OLDEST = (0, 8, 0)
"""The oldest release Snooze speaks to: /is_sleeping arrived in 0.8.0."""
SLEEP_STATE_FROM = (0, 11, 1)
WEIGHT_CHECKER_FROM = (0, 32, 0)
DEV_MODE = "VLLM_SERVER_DEV_MODE"
PRIVATE = "keep its port private: dev mode also opens admin routes (the chart's NetworkPolicy)"
ENABLE_DEV_MODE = (
    f"set the environment variable {DEV_MODE}=1 in the engine's container, and {PRIVATE}"
)
ENABLE_SLEEP = "add --enable-sleep-mode to the engine's `vllm serve` arguments"
KNOWN_BUGS = "docs/vllm-contract.md"


@dataclass(frozen=True, kw_only=True)
class ServerInfo:
    """What /server_info (dev mode, vLLM 0.8.5+; JSON from 0.11.0) says of how the engine was
    started."""

    sleep_mode: bool | None
    """model_config.enable_sleep_mode; None where the answer does not say (older releases
    answer the configuration as text, which leaves it out)."""
    tensor_parallel: int | None
    pipeline_parallel: int | None
    lora: bool | None


@dataclass(frozen=True, kw_only=True)
class PodSeen:
    """The pod `--pod` names, as read through the API (or why it could not be)."""

    namespace: str
    name: str
    spec: Mapping[str, Any] | None = None
    failure: str = ""
    released: bool = False
    """An SGLang server's: the operator's annotation says it released or paused it."""

    @property
    def shown(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def args(self) -> ServeArgs | None:
        return None if self.spec is None else serve_args(self.spec)

    @property
    def dev_mode(self) -> bool | None:
        """Whether its containers set VLLM_SERVER_DEV_MODE=1; None when an env source (a
        ConfigMap, a Secret) or a reference may set it and is not read here."""
        found: bool | None = False
        for container in (self.spec or {}).get("containers") or []:
            if not isinstance(container, Mapping):
                continue
            for env in container.get("env") or []:
                if isinstance(env, Mapping) and env.get("name") == DEV_MODE:
                    if "valueFrom" in env:
                        found = None  # set from elsewhere: not known here
                    elif str(env.get("value", "")) == "1":
                        return True
            if container.get("envFrom"):
                found = None
        return found


def version_of(asked: Asked) -> str | None:
    """The release string of a vLLM /version answer; None when it is not one."""
    if asked.status != 200:
        return None
    data = json_object(asked)
    found = data.get("version") if data is not None else None
    if not isinstance(found, str) or not 0 < len(found) <= 64 or not found.isprintable():
        return None
    return found


def engine(subject: Subject, url: str, asked: Asked) -> Result:
    """The `engine` check: reachable, a vLLM, of a release Snooze speaks to."""
    if not asked.answered:
        return failure(
            subject,
            "engine",
            f"no answer from {url}/version: {asked.failure}",
            "check the URL and that the engine runs; from outside its cluster, forward its port "
            "(kubectl port-forward -n NAMESPACE pod/NAME 8000) and check http://127.0.0.1:8000",
        )
    found = version_of(asked)
    if found is None:
        return failure(
            subject,
            "engine",
            f"{url} answers, but not as vLLM does: /version answered {answer_said(asked)}",
            "point --engine at a vLLM server's port (8000 unless --port says otherwise)",
        )
    release = release_of(found)
    if release is None:
        return warning(
            subject,
            "engine",
            f"vLLM {found!r}: a version Snooze cannot place among vLLM's releases",
            "known bugs are judged as if every row applied; run a released vLLM",
            version=found,
            kind=VLLM,
        )
    if release < OLDEST:
        return failure(
            subject,
            "engine",
            f"vLLM {found} has no /is_sleeping: Snooze needs {format_release(OLDEST)} or later",
            "run vLLM 0.8.0 or later (0.10.2 or later for level-2 sleep)",
            version=found,
            kind=VLLM,
        )
    return ok(subject, "engine", f"vLLM {found} answers", version=found, kind=VLLM)


def dev_mode(subject: Subject, asked: Asked, pod: PodSeen | None) -> Result:
    """The `dev-mode` check, from /is_sleeping (a dev-mode route)."""
    said_by_pod = _pod_dev_mode(pod)
    if asked.status == 200:
        data = json_object(asked)
        value = data.get("is_sleeping") if data is not None else None
        if isinstance(value, bool):
            state = "asleep" if value else "awake"
            return ok(
                subject,
                "dev-mode",
                f"the sleep routes answer ({DEV_MODE}=1); it is {state} now",
                sleeping=value,
            )
        return failure(
            subject,
            "dev-mode",
            f'/is_sleeping answered {answer_said(asked)}, not {{"is_sleeping": true|false}}',
            "point --engine at the vLLM server's port",
        )
    if asked.status == 404:
        return failure(
            subject,
            "dev-mode",
            f"/is_sleeping answers 404: the engine runs without {DEV_MODE}=1, so /sleep and "
            f"/wake_up are not there and Snooze cannot put it to sleep{said_by_pod}",
            ENABLE_DEV_MODE,
        )
    if not asked.answered:
        return failure(
            subject, "dev-mode", f"no answer from /is_sleeping: {asked.failure}", _LOOK_AT_LOG
        )
    return failure(subject, "dev-mode", f"/is_sleeping answered {answer_said(asked)}", _LOOK_AT_LOG)


def server_info(asked: Asked | None) -> ServerInfo | None:
    """What /server_info?config_format=json says; None when it said nothing usable."""
    if asked is None or asked.status != 200:
        return None
    data = json_object(asked)
    config = data.get("vllm_config") if data is not None else None
    if isinstance(config, str):
        # Releases before the JSON format print the configuration as text: it gives the
        # parallel sizes but not sleep mode nor LoRA.
        return ServerInfo(
            sleep_mode=None,
            tensor_parallel=_number_in(config, "tensor_parallel_size"),
            pipeline_parallel=_number_in(config, "pipeline_parallel_size"),
            lora=None,
        )
    if not isinstance(config, Mapping):
        return None
    model = config.get("model_config")
    parallel = config.get("parallel_config")
    sleep = model.get("enable_sleep_mode") if isinstance(model, Mapping) else None
    lora = config.get("lora_config", ...)
    return ServerInfo(
        sleep_mode=sleep if isinstance(sleep, bool) else None,
        tensor_parallel=_size_of(parallel, "tensor_parallel_size"),
        pipeline_parallel=_size_of(parallel, "pipeline_parallel_size"),
        lora=None if lora is ... else lora is not None,
    )


def sleep_mode(subject: Subject, info: ServerInfo | None, pod: PodSeen | None, dev: bool) -> Result:
    """The `sleep-mode` check: from the engine's own configuration where it says, else from
    the pod's arguments; `dev` says whether the dev-mode routes answered."""
    if info is not None and info.sleep_mode is not None:
        if info.sleep_mode:
            return ok(subject, "sleep-mode", "on (--enable-sleep-mode, as /server_info says)")
        return failure(
            subject,
            "sleep-mode",
            "off: /server_info says the engine was started without --enable-sleep-mode; its "
            "/sleep would fail",
            ENABLE_SLEEP,
        )
    args = pod.args if pod is not None else None
    if pod is not None and args is not None:
        if args.sleep_mode:
            return ok(subject, "sleep-mode", f"on (--enable-sleep-mode in pod {pod.shown})")
        if args.sleep_mode is None and args.config_file:
            return warning(
                subject,
                "sleep-mode",
                f"not known: pod {pod.shown} takes its arguments from a --config file",
                "make sure the file sets enable-sleep-mode: true; --cycle proves it",
            )
        return failure(
            subject,
            "sleep-mode",
            f"off: pod {pod.shown} runs vLLM without --enable-sleep-mode",
            ENABLE_SLEEP,
        )
    if not dev:
        where = "/server_info, a dev-mode route, cannot say, as dev mode does not answer"
    elif info is not None:
        where = "/server_info answers its configuration as text, without it (before vLLM 0.11.0)"
    else:
        where = "/server_info does not answer (vLLM before 0.8.5)"
    return warning(
        subject,
        "sleep-mode",
        f"not known: {where}",
        "give --pod NAMESPACE/NAME to read its arguments, or --cycle to sleep and wake it once",
    )


def serve_args_check(subject: Subject, pod: PodSeen) -> Result:
    """The `serve-args` check (with --pod): what the known-bug table reads from the pod."""
    args = pod.args
    if args is None:
        return failure(
            subject,
            "serve-args",
            f"pod {pod.shown} cannot be read: {pod.failure}",
            "give --pod as NAMESPACE/NAME of the engine's pod, with credentials that may get it",
        )
    return ok(subject, "serve-args", f"pod {pod.shown}: {_described(args)}")


def known_bugs(
    subject: Subject, version: str | None, info: ServerInfo | None, pod: PodSeen | None
) -> Result:
    """The `known-bugs` check: the rows of the operator's table (policy/knownbugs.py) that
    apply to this release as the engine runs, the sleep levels the release cannot wake from,
    and what Snooze does about them."""
    facts, source = serve_facts(version, info, pod)
    shown_release = f"vLLM {version}" if version else "an unknown release"
    limits = knownbugs.level_limits(ServeFacts(version=version))
    limited = "; ".join(f"{limit.said} ({limit.source})" for limit in limits)
    if facts is None:
        # How it runs is not (wholly) known: the rows its release has with what is not known
        # taken at its worst.
        lora = info.lora if info is not None else None
        tensor = info.tensor_parallel if info is not None else None
        pipeline = info.pipeline_parallel if info is not None else None
        anyhow = ServeFacts(
            version=version,
            lora=True if lora is None else lora,
            tensor_parallel=tensor or 2,
            pipeline_parallel=pipeline or 2,
        )
        unknown = [
            what
            for what, value in (
                ("LoRA", lora),
                ("tensor parallelism", tensor),
                ("pipeline parallelism", pipeline),
            )
            if value is None
        ]
        possible = knownbugs.known_bugs(anyhow)
        found = [f"{limited}: Snooze sleeps it at level 1 instead"] if limits else []
        if possible:
            found.append(
                f"with {' or '.join(unknown)} (not known here), it is in: {_keys(possible)}"
            )
        if not found:
            return ok(
                subject, "known-bugs", f"none of Snooze's known vLLM bugs is in {shown_release}"
            )
        fix = "give --pod NAMESPACE/NAME to read its arguments" if possible else _UPGRADE
        return warning(
            subject,
            "known-bugs",
            f"{shown_release}: {'; '.join(found)}",
            fix,
            bugs=[bug.key for bug in possible],
        )
    bugs = knownbugs.known_bugs(facts)
    running = f"{shown_release} at {_described_facts(facts)} ({source})"
    if not bugs and not limits:
        return ok(subject, "known-bugs", f"none applies to {running}")
    conducts = {level: knownbugs.conduct(facts, level, "FallBack") for level in knownbugs.LEVELS}
    said = "; ".join(f"level {level}: {c.why}" for level, c in conducts.items() if c.why)
    text = f"{running}: {knownbugs.describe(bugs, limits)}. Snooze (wake.onKnownBug FallBack): "
    text += said
    never = all(c.level is None for c in conducts.values())
    judged = failure if never else warning
    without = ", or run it without what they need" if never else " to sleep it as asked"
    fix = f"{_UPGRADE}{without}" if bugs else _UPGRADE
    return judged(subject, "known-bugs", text, fix, bugs=[bug.key for bug in bugs])


_UPGRADE = f"upgrade vLLM past what it says ({KNOWN_BUGS})"


def checker_present(asked: Asked) -> bool:
    """Whether /weight_checker is there: it refused the empty body as a route refuses a body
    without its required field (FastAPI's 422, vLLM 0.33's 400)."""
    return asked.status in (400, 422)


def weight_checker(subject: Subject, asked: Asked, version: str | None) -> Result:
    """The `weight-checker` check: whether /weight_checker is there, asked with an empty body
    that it refuses before hashing anything (its `action` is required)."""
    release = release_of(version)
    if asked.status == 404 and _fastapi_not_found(asked):
        newer = release is not None and release >= WEIGHT_CHECKER_FROM
        if newer:
            return warning(
                subject,
                "weight-checker",
                f"vLLM {version} has no /weight_checker here: wakes are checked by their answers "
                "only",
                "look for a proxy in front of the engine that hides it",
            )
        return ok(
            subject,
            "weight-checker",
            f"none before vLLM 0.32.0: wakes are checked by their answers only (vLLM {version})",
        )
    if checker_present(asked):
        return ok(
            subject,
            "weight-checker",
            "/weight_checker answers: wakes are checked against the weights' digests too",
        )
    shown = f"answered {answer_said(asked)}" if asked.answered else f"no answer: {asked.failure}"
    return warning(
        subject,
        "weight-checker",
        f"/weight_checker {shown}",
        "wakes are then checked by their answers only; read the engine's log",
    )


def metrics(
    subject: Subject,
    probe: ActivitySnapshot | None,
    probe_failure: str,
    filtered: Asked,
    whole: Asked,
    version: str | None,
) -> Result:
    """The `metrics` check: the operator's own probe of the engine, what the page holds of the
    families Snooze reads, and what a probe costs."""
    if probe is None:
        return failure(
            subject,
            "metrics",
            f"the operator's probe of /metrics fails: {probe_failure}",
            "Snooze cannot tell whether it is idle: make /metrics serve vLLM's own page",
        )
    found: set[str] = set()
    if whole.status == 200:
        try:
            found = {
                n for n, _, _ in samples(whole.text, ACTIVITY_METRICS, series_limit=SERIES_LIMIT)
            }
        except ValueError as exc:
            return failure(
                subject, "metrics", f"the whole /metrics page cannot be read: {exc}", _LOOK_AT_LOG
            )
    state = probe.sleep_state.value if probe.sleep_state is not None else "not published"
    said = (
        f"the operator's probe reads it: {probe.running} running, {probe.waiting} waiting, "
        f"sleep state {state}"
    )
    if probe.gpu_memory_utilization is not None:
        said += f", GPU share {probe.gpu_memory_utilization:g}"
    data: dict[str, Any] = {
        "probe_bytes": len(filtered.body) if filtered.answered else None,
        "page_bytes": len(whole.body) if whole.answered else None,
    }
    gaps: list[str] = []
    fixes: list[str] = []
    release = release_of(version)
    if SLEEP_STATE not in found and release is not None and release >= SLEEP_STATE_FROM:
        gaps.append(f"no {SLEEP_STATE} (vLLM 0.11.1+ publishes it)")
        fixes.append("serve vLLM's own /metrics")
    if CACHE_CONFIG not in found:
        gaps.append(f"no {CACHE_CONFIG}, so its GPU share is not known")
        fixes.append("in a GPUPool, give its model spec.pool.memory")
    if OPERATIONS not in found and release is not None and release >= WEIGHT_CHECKER_FROM:
        said += f"; {OPERATIONS} appears after its first sleep or wake"
    if filtered.answered and unfiltered(filtered.text, ACTIVITY_METRICS):
        gaps.append(
            f"it ignores the name[] filter: each probe reads the whole page "
            f"({size(len(filtered.body))})"
        )
        fixes.append("nothing to do for Snooze to work; probes cost more CPU at scale")
    elif filtered.answered:
        said += f"; a probe reads {size(len(filtered.body))}"
        if whole.answered:
            said += f" (the whole page: {size(len(whole.body))})"
    if gaps:
        return warning(
            subject, "metrics", f"{said}; but {'; '.join(gaps)}", "; ".join(fixes), **data
        )
    return ok(subject, "metrics", said, **data)


# -- helpers -----------------------------------------------------------------------------------

_LOOK_AT_LOG = "read the engine's log; restart its pod if it persists"


def _fastapi_not_found(asked: Asked) -> bool:
    """FastAPI's own 404 (no such route), not an answer of the route."""
    data = json_object(asked)
    return data is None or data.get("detail") == "Not Found"


def _pod_dev_mode(pod: PodSeen | None) -> str:
    if pod is None or pod.spec is None:
        return ""
    said = pod.dev_mode
    if said is False:
        return f" (pod {pod.shown} does not set it)"
    if said is True:
        return f" (pod {pod.shown} sets it: is --engine that pod's port?)"
    return ""


def _number_in(text: str, key: str) -> int | None:
    match = re.search(rf"\b{key}=(\d+)\b", text)
    return int(match.group(1)) if match and 1 <= int(match.group(1)) <= 1024 else None


def _size_of(parallel: object, key: str) -> int | None:
    value = parallel.get(key) if isinstance(parallel, Mapping) else None
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 1024:
        return value
    return None


def serve_facts(
    version: str | None, info: ServerInfo | None, pod: PodSeen | None
) -> tuple[ServeFacts | None, str]:
    """How the engine runs, for the table: from the pod's arguments, else from /server_info's
    JSON (which says LoRA), else not known."""
    args = pod.args if pod is not None else None
    if pod is not None and args is not None:
        facts = ServeFacts(
            version=version,
            lora=args.lora,
            tensor_parallel=args.tensor_parallel,
            pipeline_parallel=args.pipeline_parallel,
        )
        return facts, f"pod {pod.shown}'s arguments"
    if info is not None and info.lora is not None:
        facts = ServeFacts(
            version=version,
            lora=info.lora,
            tensor_parallel=info.tensor_parallel or 1,
            pipeline_parallel=info.pipeline_parallel or 1,
        )
        return facts, "as /server_info says"
    return None, ""


def _described(args: ServeArgs) -> str:
    sleep = {True: "--enable-sleep-mode", False: "sleep mode off", None: "no --enable-sleep-mode"}
    return (
        f"tensor parallel {args.tensor_parallel}, pipeline parallel {args.pipeline_parallel}, "
        f"LoRA {'on' if args.lora else 'off'}, {sleep[args.sleep_mode]}"
    )


def _described_facts(facts: ServeFacts) -> str:
    return (
        f"tensor parallel {facts.tensor_parallel}, pipeline parallel {facts.pipeline_parallel}, "
        f"LoRA {'on' if facts.lora else 'off'}"
    )


def _keys(bugs: list[knownbugs.KnownBug]) -> str:
    return "; ".join(f"{bug.key}, {bug.source}" for bug in bugs)
