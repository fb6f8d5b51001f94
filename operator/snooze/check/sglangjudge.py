"""What an SGLang server's answers mean for Snooze, check by check: its release, the keys it
wants, --enable-memory-saver, --enable-weights-cpu-backup, the known SGLang bugs of the
operator's table that apply to it, its weight checker and the metrics the operator reads. Pure:
answers in (check/asking.py's), results out.

/server_info holds every argument of the server, its API keys in clear: only the flags named
here are read from it, and no part of it is ever shown or kept.
"""

from __future__ import annotations

from dataclasses import dataclass

from snooze.check.asking import Asked, json_object, size, unfiltered
from snooze.check.report import Result, Subject, failure, ok, warning
from snooze.check.vllmjudge import PodSeen
from snooze.engine.activity import ActivitySnapshot
from snooze.engine.sglangfacts import PROBE_METRICS, QUEUED, RUNNING, SGLangFacts, parse_server_info
from snooze.policy import knownbugs
from snooze.policy.knownbugs import OLDEST_SGLANG, SGLANG, ServeFacts, format_release

CPU_BACKUP_FROM = (0, 5, 3)
WEIGHTS_CHECKER_FROM = (0, 5, 6)
CHECKSUM_FROM = (0, 5, 12)
READY_FROM = (0, 5, 20)
"""GET /ready, which answers 503 while generation is paused."""
SGLANG_DOCS = "docs/sglang.md"
PRIVATE = "keep its port private instead (the chart's NetworkPolicy)"
KEYS = (("api_key", "--api-key"), ("admin_api_key", "--admin-api-key"))


@dataclass(frozen=True)
class ServerSaid:
    """What the check reads of a /server_info answer: the facts the operator reads, and the
    flags of the keys the server was given (their names, never their values)."""

    facts: SGLangFacts | None
    why: str = ""
    """Why there are no facts."""
    keys: tuple[str, ...] = ()


KEY_REFUSALS = {401: "Unauthorized", 403: "Forbidden"}
"""How SGLang's API-key check refuses a request without its key, and nothing else: the same
in every release Snooze speaks to (0.4.9 `srt/utils.py`, 0.5.23 `srt/utils/auth.py`)."""


def wants_key(asked: Asked) -> bool:
    """Whether an answer to /server_info is SGLang's own refusal for want of its API key; a
    proxy or another server that asks for a login refuses in other words."""
    if asked.status not in KEY_REFUSALS:
        return False
    return json_object(asked) == {"error": KEY_REFUSALS[asked.status]}


def server_said(asked: Asked) -> ServerSaid:
    """The facts of an SGLang /server_info (or /get_server_info) answer, or why there are none."""
    if asked.status != 200:
        return ServerSaid(None, "no answer" if not asked.answered else f"HTTP {asked.status}")
    data = json_object(asked)
    if data is None:
        return ServerSaid(None, "not a JSON object")
    try:
        facts = parse_server_info(data)
    except ValueError as exc:
        return ServerSaid(None, str(exc))
    keys = tuple(flag for key, flag in KEYS if data.get(key))
    return ServerSaid(facts, keys=keys)


def engine(subject: Subject, url: str, facts: SGLangFacts, path: str) -> Result:
    """The `engine` check of a server found to be SGLang: of a release Snooze speaks to."""
    if facts.release < OLDEST_SGLANG:
        return failure(
            subject,
            "engine",
            f"SGLang {facts.version} has no /pause_generation: Snooze needs "
            f"{format_release(OLDEST_SGLANG)} or later, and never puts it to sleep",
            "run SGLang 0.4.9 or later (0.5.3 or later for level-1 sleep)",
            version=facts.version,
            kind=SGLANG,
        )
    return ok(
        subject,
        "engine",
        f"SGLang {facts.version} answers ({path})",
        version=facts.version,
        kind=SGLANG,
    )


def keyed(subject: Subject, url: str, asked: Asked, path: str) -> Result:
    """The `engine` check of a server whose /server_info wants a key (--api-key): Snooze sends
    none, so it can do nothing with it."""
    return failure(
        subject,
        "engine",
        f"{url}{path} answers {asked.status}: the server wants a key (--api-key) that Snooze "
        "does not send; it can neither read nor sleep it",
        f"start it without --api-key and {PRIVATE}",
    )


def api_keys(subject: Subject, keys: tuple[str, ...]) -> Result:
    """The `api-keys` check: whether the routes Snooze sends need a key it does not have."""
    if not keys:
        return ok(
            subject, "api-keys", "no --api-key nor --admin-api-key: its admin routes answer Snooze"
        )
    return failure(
        subject,
        "api-keys",
        f"it runs with {' and '.join(keys)}: its admin routes (pause, release, resume) want "
        "a key that Snooze does not send, so Snooze cannot put it to sleep",
        f"start it without {' and '.join(keys)} and {PRIVATE}",
        keys=list(keys),
    )


def memory_saver(subject: Subject, facts: SGLangFacts) -> Result:
    """The `memory-saver` check: without --enable-memory-saver a release frees nothing, and
    Snooze never sleep-cycles the server."""
    if facts.memory_saver:
        return ok(subject, "memory-saver", "on (--enable-memory-saver, as /server_info says)")
    return failure(
        subject,
        "memory-saver",
        "off: the server runs without --enable-memory-saver, so a release answers 200 and frees "
        "nothing; Snooze never puts it to sleep",
        "add --enable-memory-saver to its sglang.launch_server arguments",
    )


def cpu_backup(subject: Subject, facts: SGLangFacts) -> Result:
    """The `cpu-backup` check: which level the server sleeps at, as its flag makes it."""
    if facts.host_copy:
        return ok(
            subject,
            "cpu-backup",
            "on (--enable-weights-cpu-backup): it sleeps at level 1, its weights kept in host "
            "RAM; a wake copies them back",
            level=1,
        )
    before = facts.release < CPU_BACKUP_FROM
    why = (
        f"SGLang {facts.version} has no --enable-weights-cpu-backup (0.5.3+)"
        if before
        else "off (no --enable-weights-cpu-backup)"
    )
    return ok(
        subject,
        "cpu-backup",
        f"{why}: it sleeps at level 2, its weights dropped; a wake reads them again from "
        f"{_short(facts.model_path)!r} (/update_weights_from_disk)",
        level=2,
    )


def known_bugs(subject: Subject, facts: SGLangFacts) -> Result:
    """The `known-bugs` check: the SGLang rows of the operator's table (policy/knownbugs.py)
    that apply to this release at its tensor parallel size, and what Snooze does about them."""
    serve = serve_facts(facts)
    bugs = knownbugs.known_bugs(serve)
    running = f"SGLang {facts.version} at tensor parallel {facts.tensor_parallel}"
    if not bugs:
        return ok(subject, "known-bugs", f"none of Snooze's known SGLang bugs applies to {running}")
    conduct = knownbugs.conduct(serve, knownbugs.sglang_level(facts.host_copy) or 2, "FallBack")
    what = conduct.why or f"sleeps at level {conduct.level}"
    return warning(
        subject,
        "known-bugs",
        f"{running}: {knownbugs.describe(bugs)}. Snooze (wake.onKnownBug FallBack): {what}, "
        "always drained and paused first",
        f"upgrade SGLang past what it says ({SGLANG_DOCS})",
        bugs=[bug.key for bug in bugs],
    )


def weight_checker(subject: Subject, facts: SGLangFacts) -> Result:
    """The `weight-checker` check, from the release: /weights_checker is not asked outside
    --cycle, as every call of it reaches the scheduler (an unknown action too) and `checksum`
    hashes every tensor."""
    if facts.release >= CHECKSUM_FROM:
        return ok(
            subject,
            "weight-checker",
            f"SGLang {facts.version} has /weights_checker's checksum (0.5.12+): wakes are "
            "checked against the weights' digests too (--cycle asks it)",
        )
    has = (
        "has /weights_checker without its checksum action"
        if facts.release >= (WEIGHTS_CHECKER_FROM)
        else "has no /weights_checker"
    )
    return ok(
        subject,
        "weight-checker",
        f"SGLang {facts.version} {has} (checksum: 0.5.12+): wakes are checked by their answers "
        "only",
    )


def metrics(
    subject: Subject,
    facts: SGLangFacts,
    probe: ActivitySnapshot | None,
    probe_failure: str,
    filtered: Asked,
    whole: Asked,
) -> Result:
    """The `metrics` check: the operator's own probe of /metrics (--enable-metrics), and what a
    probe costs."""
    if probe is None:
        fix = (
            "add --enable-metrics to its sglang.launch_server arguments"
            if not facts.metrics or filtered.status == 404
            else "make /metrics serve SGLang's own page"
        )
        return failure(
            subject,
            "metrics",
            f"the operator's probe of /metrics fails: {probe_failure}; Snooze cannot see its "
            "requests in flight, and never releases a server it cannot drain",
            fix,
        )
    said = (
        f"the operator's probe reads it: {probe.running} running ({RUNNING}), {probe.waiting} "
        f"queued ({QUEUED})"
    )
    data = {
        "probe_bytes": len(filtered.body) if filtered.answered else None,
        "page_bytes": len(whole.body) if whole.answered else None,
    }
    if filtered.status == 200 and unfiltered(filtered.text, PROBE_METRICS):
        return warning(
            subject,
            "metrics",
            f"{said}; but it ignores the name[] filter: each probe reads the whole page "
            f"({size(len(filtered.body))})",
            "nothing to do for Snooze to work; probes cost more CPU at scale",
            **data,
        )
    if filtered.status == 200:
        said += f"; a probe reads {size(len(filtered.body))}"
        if whole.status == 200:
            said += f" (the whole page: {size(len(whole.body))})"
    return ok(subject, "metrics", said, **data)


def pod_read(subject: Subject, pod: PodSeen) -> Result:
    """The `serve-args` check of an SGLang server's pod (--pod): read for the operator's
    annotation only, since /server_info says its arguments."""
    if pod.spec is None:
        return failure(
            subject,
            "serve-args",
            f"pod {pod.shown} cannot be read: {pod.failure}",
            "give --pod as NAMESPACE/NAME of the server's pod, with credentials that may get it",
        )
    said = "released or paused on it" if pod.released else "nothing released on it"
    return ok(
        subject,
        "serve-args",
        f"pod {pod.shown}: its snooze.dev/released annotation says {said} (its arguments are "
        "read from /server_info)",
    )


def _short(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def serve_facts(facts: SGLangFacts) -> ServeFacts:
    """How the operator's known-bug table sees the server."""
    return ServeFacts(
        version=facts.version,
        engine=SGLANG,
        tensor_parallel=facts.tensor_parallel,
        host_copy=facts.host_copy,
    )


def paused(asked: Asked | None, released: bool) -> str | None:
    """Why the server must be taken to be asleep or paused already (a second release kills an
    SGLang server): /ready's 503 (0.5.20+) or the operator's annotation on its pod; None when
    neither says so."""
    if released:
        return "its pod's snooze.dev/released annotation says the operator released it"
    if asked is not None and asked.status == 503:
        return "/ready answers 503: its generation is paused (or it is unhealthy)"
    return None
