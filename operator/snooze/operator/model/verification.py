"""Wake integrity, as the operator carries it out: record an engine's greedy answer and its
weights' digests before its first sleep, and check them after each wake (docs/wake-verification.md).

The output check gates a wake: the engine is published awake only once it answered as before.
The weights check costs seconds (vLLM copies and hashes every tensor), so it never holds a
request: it runs after a level-2 wake (which reloads the weights) has been published, and after
an output check failed, to say which it was.
"""

from __future__ import annotations

import logging
import time

from snooze.engine import sglang
from snooze.engine.errors import AnswerTooLargeError, EngineError, EngineHTTPError
from snooze.engine.http import EngineHttp
from snooze.engine.interface import engine_client
from snooze.engine.verify import NoGenerationRoute, digest, greedy, weight_checksums
from snooze.operator.memory import EngineMemory, Integrity
from snooze.operator.metrics import OperatorMetrics
from snooze.policy.integrity import (
    CHECKED,
    Answer,
    Check,
    Verdict,
    judge,
    recorded,
    weights_verdict,
)
from snooze.policy.runs import Process

log = logging.getLogger(__name__)

GREEDY_TIMEOUT = 30.0
"""A few tokens of one request on an engine that serves nothing else."""
CHECKSUM_TIMEOUT = 600.0
"""vLLM hashes every weight tensor on the host: about a second per GiB on one rank, so a 70B
model at tensor parallel 1 takes minutes (benchmarks/README.md)."""
NO_CHECKER = (
    "the engine has no /weight_checker (vLLM 0.32.0 and later serve it, in dev mode): its "
    "weights are not checked"
)


class Verifier:
    """Records and checks one model's engines; the outcome goes to their memory (and from
    there to the status) and to the metrics."""

    def __init__(
        self, *, http: EngineHttp, metrics: OperatorMetrics, namespace: str, model: str
    ) -> None:
        self.http, self.metrics = http, metrics
        self.namespace, self.model = namespace, model
        self.kind = "vllm"
        """The model's engine kind (spec.engine.kind), as its executor last saw it."""

    def current(self, engine: EngineMemory, process: Process) -> Integrity:
        """The engine's records for this run, starting over for a new one."""
        if not engine.integrity.of(process):
            engine.integrity = Integrity(process=process)
        return engine.integrity

    async def record(
        self,
        url: str,
        model_name: str,
        engine: EngineMemory,
        process: Process,
        *,
        weights: bool = True,
        output: bool = True,
    ) -> None:
        """Before a sleep: record what is not recorded yet for this run (with `output`, its
        greedy answer, twice; with `weights`, its weights' digests). Never fails the sleep:
        what cannot be recorded is said on the status."""
        integrity = self.current(engine, process)
        asked = (
            output
            and integrity.output in (Check.PENDING, Check.MISSED, Check.UNAVAILABLE)
            and not integrity.output_given_up
        )
        if asked:
            started = time.monotonic()
            try:
                first = await self._greedy(url, model_name, integrity)
                second = await self._greedy(url, model_name, integrity)
            except NoGenerationRoute as exc:
                integrity.output, integrity.message = Check.UNSUPPORTED, str(exc)
            except EngineError as exc:
                integrity.output, integrity.message = Check.UNAVAILABLE, _asking_failed(exc)
                integrity.output_given_up = lasting(exc)
            else:
                integrity.output = recorded(first, second)
                integrity.baseline = first
                integrity.message = (
                    ""
                    if integrity.output is Check.RECORDED
                    else f"two greedy answers before its first sleep differed ({first.shown()}, "
                    f"then {second.shown()}): its answers are not checked after wakes"
                )
            self._observe("output", started)
        if (
            weights
            and integrity.weights in (Check.PENDING, Check.UNAVAILABLE)
            and not integrity.weights_given_up
        ):
            asked = True
            started = time.monotonic()
            try:
                sums = await _checksums(self.http, url, self.kind)
            except EngineError as exc:
                integrity.weights = Check.UNAVAILABLE
                integrity.weights_given_up = lasting(exc)
                integrity.message = integrity.message or _asking_failed(exc)
            else:
                if sums is None:
                    integrity.weights = Check.UNSUPPORTED
                else:
                    integrity.weights = Check.RECORDED
                    integrity.weights_digest, integrity.weights_count = digest(sums), len(sums)
                    integrity.weights_full = sums
            self._observe("weights", started)
        if asked:
            await _forget_own_requests(url, self.http, engine, self.kind)

    async def output_after_wake(
        self, url: str, model_name: str, engine: EngineMemory, process: Process
    ) -> Verdict | None:
        """After a wake, before the engine is published: its greedy answer against the record.
        None when there is nothing to compare (no record for this run, or not checkable)."""
        integrity = self.current(engine, process)
        if integrity.output not in CHECKED or integrity.baseline is None:
            if integrity.output is Check.PENDING:
                # Asleep with nothing recorded: the record was lost (an operator restart) or
                # never taken. Said so; taken again at its next sleep.
                integrity.output = Check.MISSED
                integrity.message = (
                    "it slept with no record of its answer (the operator restarted before "
                    "writing it, or verification was turned on while it slept): this wake is "
                    "not checked; its answer is recorded again at its next sleep"
                )
            self._count("output", "unverifiable")
            return None
        started = time.monotonic()
        try:
            first = await self._greedy(url, model_name, integrity)
            second = (
                None
                if first.same_as(integrity.baseline)
                else await self._greedy(url, model_name, integrity)
            )
        except EngineError as exc:
            # Not an answer at all: the wake's own checks say what is wrong with the engine.
            self._observe("output", started)
            integrity.message = _asking_failed(exc)
            self._count("output", "unverifiable")
            return Verdict(state=Check.UNAVAILABLE, message=integrity.message)
        self._observe("output", started)
        verdict = judge(integrity.baseline, first, second)
        integrity.output = verdict.state
        if verdict.state is Check.NOT_DETERMINISTIC:
            integrity.message = verdict.message
        if verdict.failed:
            integrity.quarantined = True
        self._count("output", _result(verdict))
        await _forget_own_requests(url, self.http, engine, self.kind)
        return verdict

    async def weights_after_wake(
        self, url: str, engine: EngineMemory, process: Process
    ) -> Verdict | None:
        """The weights' digests against the record; None when there is none to compare."""
        integrity = self.current(engine, process)
        if integrity.weights not in CHECKED or integrity.weights_digest is None:
            return None
        started = time.monotonic()
        try:
            sums = await _checksums(self.http, url, self.kind)
        except EngineError as exc:
            self._observe("weights", started)
            self._count("weights", "unverifiable")
            return Verdict(state=Check.UNAVAILABLE, message=_asking_failed(exc))
        self._observe("weights", started)
        if sums is None:  # the engine was replaced by an older release under the same run?
            self._count("weights", "unverifiable")
            return None
        full = integrity.weights_full
        mismatches = (
            None
            if full is None
            else sorted(k for k in full.keys() | sums.keys() if full.get(k) != sums.get(k))
        )
        verdict = weights_verdict(
            integrity.weights_digest, integrity.weights_count, digest(sums), mismatches
        )
        integrity.weights = verdict.state
        if verdict.failed:
            integrity.quarantined = True
        self._count("weights", _result(verdict))
        return verdict

    async def _greedy(self, url: str, model_name: str, integrity: Integrity) -> Answer:
        answer = await greedy(
            self.http, url, model_name, route=integrity.route, timeout=GREEDY_TIMEOUT
        )
        integrity.route = answer.route
        return Answer.of(route=answer.route, tokens=answer.tokens, text=answer.text)

    def _observe(self, check: str, started: float) -> None:
        self.metrics.verification_duration.labels(self.namespace, check).observe(
            time.monotonic() - started
        )

    def _count(self, check: str, result: str) -> None:
        self.metrics.verifications.labels(self.namespace, self.model, check, result).inc()


def _result(verdict: Verdict) -> str:
    if verdict.state is Check.VERIFIED:
        return "passed"
    return "failed" if verdict.failed else "unverifiable"


def _asking_failed(error: EngineError) -> str:
    again = " (not asked again until the engine restarts)" if lasting(error) else ""
    return f"the check could not be made{again}: {error}"


# Refusals that may pass: a timeout the client asked for, a conflict, too many requests.
PASSING_REFUSALS = (404, 408, 409, 425, 429)


def lasting(error: EngineError) -> bool:
    """A failure this run of the engine will give again: an answer too large or that cannot be
    read, or a refusal such as a 401 for an API key the operator does not have. A timeout, a
    broken connection or a 5xx may pass, and are asked again at the next sleep."""
    if isinstance(error, AnswerTooLargeError):
        return True
    if not isinstance(error, EngineHTTPError):
        return False
    return error.status < 300 or (
        400 <= error.status < 500 and error.status not in PASSING_REFUSALS
    )


async def _checksums(http: EngineHttp, url: str, kind: str) -> dict[str, str] | None:
    """The weights' digests, as the engine's kind computes them (None: it cannot)."""
    if kind == "sglang":
        return await sglang.weight_checksums(http, url, timeout=CHECKSUM_TIMEOUT)
    return await weight_checksums(http, url, timeout=CHECKSUM_TIMEOUT)


async def _forget_own_requests(
    url: str, http: EngineHttp, engine: EngineMemory, kind: str = "vllm"
) -> None:
    """The checks are requests the engine counts as served: start the engine's count afresh
    from here, so that they are not taken for traffic that bypassed the gateway (which would
    date its activity to now and have it probed every interval)."""
    try:
        snapshot = await engine_client(kind, url, client=http, timeout=5.0).activity()
    except EngineError:
        return
    engine.success_total = snapshot.success_total
    engine.ledger = None
