"""`snooze check --engine URL --cycle`: one real sleep and wake of an idle engine, as the operator
would carry them out, timed, with the wake checked as the operator checks one (its greedy answer
and its weights' digests against those before the sleep: policy/integrity.py)."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from snooze.check.asking import ask
from snooze.check.report import Result, Subject, failure, ok, warning
from snooze.engine.activity import ActivitySnapshot
from snooze.engine.client import EngineClient
from snooze.engine.errors import EngineError
from snooze.engine.http import EngineHttp
from snooze.engine.verify import NoGenerationRoute, digest, greedy, weight_checksums
from snooze.policy import knownbugs
from snooze.policy.integrity import Answer, Check, judge, recorded, weights_verdict
from snooze.policy.knownbugs import ServeFacts

GREEDY_TIMEOUT = 30.0
"""A few tokens of one request on an engine that serves nothing else."""
CHECKSUM_TIMEOUT = 600.0
"""vLLM hashes every weight tensor on the host: minutes for a large model on one rank."""


@dataclass(frozen=True, kw_only=True)
class CycleOptions:
    level: int | None = None
    """The sleep level asked for (the known-bug table may move it, as it does the operator's);
    None: the operator's default (1 for vLLM; an SGLang server's flags decide)."""
    timeout: float = 300.0
    """The most the sleep, and then the wake, may take each."""
    force: bool = False
    """Cycle an engine that is serving requests (its /sleep waits for them on vLLM 0.17+)."""
    model: str | None = None
    """The model name for the greedy requests; default: the first /v1/models lists."""
    checker: bool = True
    """Whether /weight_checker answered (else the weights are not compared)."""


@dataclass(frozen=True, kw_only=True)
class EngineOptions:
    timeout: float = 10.0
    """The most each request may take (the cycle's sleep and wake have their own)."""
    cycle: CycleOptions | None = None
    """Sleep and wake it once, with these options; None: do not."""


@dataclass(frozen=True, kw_only=True)
class Before:
    """What the engine said before the cycle."""

    sleeping: bool
    activity: ActivitySnapshot | None
    facts: ServeFacts


def refusal(subject: Subject, before: Before, options: CycleOptions) -> Result | None:
    """Pure: why the cycle must not run, as its one failure line; None when it may."""
    if before.sleeping:
        return failure(
            subject,
            "cycle-sleep",
            "not run: the engine is asleep already (is Snooze's operator managing it?)",
            "run --cycle on an awake engine that no operator manages (or set its "
            "InferenceModel's desiredState: Awake first)",
        )
    busy = before.activity.in_flight if before.activity is not None else 0
    if busy and not options.force:
        return failure(
            subject,
            "cycle-sleep",
            f"not run: the engine is serving {busy} request(s), and a sleep stops generation",
            _BUSY_FIX[before.facts.engine],
            in_flight=busy,
        )
    return None


_BUSY_FIX = {
    knownbugs.VLLM: "run it when the engine is idle, or add --force (vLLM 0.17+ waits for "
    "requests in flight; older releases abort them)",
    knownbugs.SGLANG: "run it when the server is idle, or add --force (Snooze pauses generation "
    "and releases nothing while a request is still running)",
}


def level_to_use(subject: Subject, facts: ServeFacts, asked: int | None) -> tuple[int | None, str]:
    """Pure: the level the operator would sleep it at when asked for `asked` (the known-bug
    table, wake.onKnownBug FallBack; None: it keeps the engine awake), and why, when that is
    not `asked`. Not asked: level 1 for vLLM, the level an SGLang server's flags make."""
    sglang = facts.engine == knownbugs.SGLANG
    conduct = knownbugs.conduct(facts, asked or 1, "FallBack")
    if conduct.level is not None and (
        conduct.level == asked or (asked is None and (sglang or conduct.level == 1))
    ):
        return conduct.level, ""
    if sglang and conduct.level is not None:
        flag = "with" if facts.host_copy else "without"
        return conduct.level, (
            f"not at level {asked} as asked: an SGLang server sleeps at the level its flags make "
            f"({flag} --enable-weights-cpu-backup)"
        )
    return conduct.level, f"not at level {asked or 1} as asked: Snooze {conduct.why}"


@dataclass(frozen=True, kw_only=True)
class Steps:
    """What a cycle does that differs by engine kind: how it sleeps, confirms the sleep, wakes
    and digests the weights, and what each failure tells the user to do."""

    sleep: Callable[[int, float], Awaitable[None]]
    """Put it to sleep at a level, within a timeout."""
    not_asleep: Callable[[], Awaitable[str | None]]
    """Why it is not asleep after its sleep answered; None when it is, or cannot say."""
    wake: Callable[[int, float], Awaitable[None]]
    checksums: Callable[[], Awaitable[dict[str, str] | None]]
    """Every weight tensor's digest; None where the engine has no weight checker."""
    sleep_fix: str
    wake_fix: str


def vllm_steps(http: EngineHttp, url: str) -> Steps:
    """A vLLM engine's: /sleep?mode=wait, /is_sleeping, /wake_up (and the reload of level 2),
    /weight_checker."""
    client = EngineClient(url, client=http, timeout=10.0)

    async def not_asleep() -> str | None:
        return None if await client.is_sleeping() else "/is_sleeping still says false"

    return Steps(
        sleep=lambda level, seconds: client.sleep(level, "wait", timeout=seconds),
        not_asleep=not_asleep,
        wake=lambda level, seconds: client.wake(level, timeout=seconds),
        checksums=lambda: weight_checksums(http, url, timeout=CHECKSUM_TIMEOUT),
        sleep_fix="read the engine's log; if it runs without --enable-sleep-mode, add it",
        wake_fix=f"the engine may be left asleep: POST {url}/wake_up, or restart its pod",
    )


async def run(
    subject: Subject,
    http: EngineHttp,
    url: str,
    before: Before,
    options: CycleOptions,
    steps: Steps | None = None,
) -> list[Result]:
    """The cycle; each step a line. Stops at the first step that fails, saying where it left
    the engine. `steps`: the engine kind's (default: vLLM's)."""
    refused = refusal(subject, before, options)
    if refused is not None:
        return [refused]
    level, moved = level_to_use(subject, before.facts, options.level)
    if level is None:
        return [warning(subject, "cycle-sleep", f"not run: {moved}", "see the known-bugs line")]
    steps = steps or vllm_steps(http, url)
    results: list[Result] = []
    model = options.model or await _first_model(http, url)

    baseline, output_note = await _record_output(http, url, model)
    sums_before, weights_note = (
        await _checksums(steps) if options.checker else (None, "no weight checker")
    )

    taken, error = await _timed(lambda: steps.sleep(level, options.timeout))
    if error is None:
        try:
            why = await steps.not_asleep()
        except EngineError as exc:
            why = str(exc)
        if why is not None:
            error = f"its sleep answered, but {why} after {taken:.2f}s"
    if error is not None:
        results.append(
            failure(
                subject,
                "cycle-sleep",
                f"level-{level} sleep failed: {error}",
                steps.sleep_fix,
                level=level,
            )
        )
        return results
    slept = f"slept at level {level} in {taken:.2f}s"
    figures = {"level": level, "sleep_seconds": round(taken, 3)}
    if moved:
        results.append(
            warning(
                subject, "cycle-sleep", f"{slept}, {moved}", "see the known-bugs line", **figures
            )
        )
    else:
        results.append(ok(subject, "cycle-sleep", slept, **figures))

    taken, error = await _timed(lambda: steps.wake(level, options.timeout))
    if error is not None:
        results.append(
            failure(
                subject,
                "cycle-wake",
                f"the level-{level} wake failed: {error}",
                steps.wake_fix,
                level=level,
            )
        )
        return results
    results.append(
        ok(
            subject,
            "cycle-wake",
            f"woke from level {level} in {taken:.2f}s",
            level=level,
            wake_seconds=round(taken, 3),
        )
    )
    results.append(await _check_output(subject, http, url, model, baseline, output_note))
    results.append(await _check_weights(subject, steps, sums_before, weights_note))
    return results


async def _timed(step: Callable[[], Awaitable[None]]) -> tuple[float, str | None]:
    started = time.monotonic()
    try:
        await step()
    except EngineError as exc:
        return time.monotonic() - started, str(exc)
    return time.monotonic() - started, None


async def _first_model(http: EngineHttp, url: str) -> str | None:
    asked = await ask(http, "GET", url + "/v1/models", timeout=GREEDY_TIMEOUT)
    return first_model(asked.body) if asked.status == 200 else None


def first_model(body: bytes) -> str | None:
    """Pure: the first model id of a /v1/models answer."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    cards = data.get("data") if isinstance(data, dict) else None
    card = cards[0] if isinstance(cards, list) and cards else None
    found = card.get("id") if isinstance(card, dict) else None
    return found if isinstance(found, str) and 0 < len(found) <= 256 else None


async def _greedy(http: EngineHttp, url: str, model: str, route: str | None) -> Answer:
    got = await greedy(http, url, model, route=route, timeout=GREEDY_TIMEOUT)
    return Answer.of(route=got.route, tokens=got.tokens, text=got.text)


async def _record_output(
    http: EngineHttp, url: str, model: str | None
) -> tuple[Answer | None, str]:
    """The greedy answer before the sleep (asked twice), or why the output is not checked."""
    if model is None:
        return None, "no model name (/v1/models did not say one; give --model)"
    try:
        first = await _greedy(http, url, model, None)
        second = await _greedy(http, url, model, first.route)
    except NoGenerationRoute:
        return None, "the model does not generate text"
    except EngineError as exc:
        return None, f"its answer before the sleep could not be had: {exc}"
    if recorded(first, second) is Check.NOT_DETERMINISTIC:
        return None, (
            f"two greedy answers before the sleep differed ({first.shown()}, then "
            f"{second.shown()}): as Snooze's operator would, it is not checked"
        )
    return first, ""


async def _check_output(
    subject: Subject,
    http: EngineHttp,
    url: str,
    model: str | None,
    baseline: Answer | None,
    note: str,
) -> Result:
    if baseline is None or model is None:
        return warning(
            subject,
            "cycle-output",
            f"not checked: {note}",
            "give --model NAME (the served model name) for an output check",
        )
    try:
        first = await _greedy(http, url, model, baseline.route)
        second = None if first.same_as(baseline) else await _greedy(http, url, model, first.route)
    except EngineError as exc:
        return failure(
            subject,
            "cycle-output",
            f"no answer after the wake: {exc}",
            "read the engine's log; restart its pod",
        )
    verdict = judge(baseline, first, second)
    if verdict.state is Check.VERIFIED:
        return ok(subject, "cycle-output", verdict.message)
    if verdict.state is Check.NOT_DETERMINISTIC:
        return warning(subject, "cycle-output", verdict.message, "nothing to do: not checked")
    return failure(
        subject,
        "cycle-output",
        verdict.message,
        "do not let Snooze sleep it at this level; see the known-bugs line and "
        "docs/wake-verification.md",
    )


async def _checksums(steps: Steps) -> tuple[dict[str, str] | None, str]:
    try:
        sums = await steps.checksums()
    except EngineError as exc:
        return None, f"the digests before the sleep could not be had: {exc}"
    return sums, "" if sums is not None else "no weight checker"


async def _check_weights(
    subject: Subject,
    steps: Steps,
    before: dict[str, str] | None,
    note: str,
) -> Result:
    if before is None:
        return ok(subject, "cycle-weights", f"not compared: {note}")
    after, failed = await _checksums(steps)
    if after is None:
        return warning(subject, "cycle-weights", f"not compared: {failed}", "read the engine's log")
    mismatches = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    verdict = weights_verdict(digest(before), len(before), digest(after), mismatches)
    if verdict.state is Check.VERIFIED:
        return ok(subject, "cycle-weights", verdict.message, tensors=len(before))
    return failure(
        subject,
        "cycle-weights",
        verdict.message,
        "do not let Snooze sleep it at this level; see docs/wake-verification.md",
    )
