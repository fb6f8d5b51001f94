"""The status's account of wake integrity: each engine's records and checks, the WakeVerified
condition, and the KnownBug condition; pure, so it is tested as data."""

from __future__ import annotations

from collections.abc import Sequence

from snooze.api.modelstatus import OutputRecord, PodVerification
from snooze.operator.conditions import ConditionValue as Reading
from snooze.operator.memory import EngineMemory, Integrity
from snooze.policy.integrity import Check
from snooze.policy.knownbugs import describe

NO_CHECKER = "no /weight_checker (vLLM 0.32.0 and later serve one, in dev mode)"


def verification_entry(engine: EngineMemory, *, verify: bool) -> PodVerification:
    """The pod entry's `verification`: what its wakes are checked against."""
    if not verify:
        return PodVerification(output=Check.OFF.value, weights=Check.OFF.value)
    integrity = engine.integrity
    entry = PodVerification(output=integrity.output.value, weights=integrity.weights.value)
    if integrity.process is not None and integrity.process.restarts is not None:
        entry.restarts = integrity.process.restarts
    baseline = integrity.baseline
    if baseline is not None:
        record = OutputRecord(route=baseline.route, text_sha256=baseline.text_sha256)
        if baseline.tokens is not None:
            record.tokens = list(baseline.tokens)
        entry.baseline = record
    if integrity.weights_digest is not None:
        entry.weights_digest = integrity.weights_digest
        entry.weight_tensors = integrity.weights_count
    if integrity.message:
        entry.message = integrity.message
    return entry


# The state that stands for a model where engines differ: the most worth saying first.
_WORST = (
    Check.MISMATCH,
    Check.NOT_DETERMINISTIC,
    Check.UNAVAILABLE,
    Check.MISSED,
    Check.UNSUPPORTED,
)


def wake_verified(engines: Sequence[tuple[str, EngineMemory]], *, verify: bool) -> Reading:
    """WakeVerified: True while every ready engine's next wake will be checked (or will be,
    once its first sleep records it); False naming the engine and why where one's is not."""
    if not verify:
        return Reading(
            type="WakeVerified",
            status=False,
            reason="VerificationOff",
            message="spec.wake.verify is false: woken engines serve without being checked",
        )
    weights = _weights_summary([engine.integrity for _, engine in engines])
    for state in _WORST:
        found = [(pod, e.integrity) for pod, e in engines if e.integrity.output is state]
        if found:
            pod, integrity = found[0]
            more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
            why = integrity.message or _WHY[state]
            return Reading(
                type="WakeVerified",
                status=False,
                reason=state.value,
                message=f"{pod}{more}: {why}. {weights}",
            )
    pending = sum(1 for _, e in engines if e.integrity.output is Check.PENDING)
    checked = len(engines) - pending
    message = f"answers checked after each wake on {checked} engine(s)"
    if pending:
        message += f"; {pending} recorded at their first sleep"
    return Reading(
        type="WakeVerified", status=True, reason="Verified", message=f"{message}. {weights}"
    )


_WHY = {
    Check.MISMATCH: "it woke answering differently than before its sleep (see WakeFailed)",
    Check.NOT_DETERMINISTIC: "its greedy answer varies between requests: not checked",
    Check.UNAVAILABLE: "its answer could not be asked for",
    Check.MISSED: "it slept with no record of its answer: its next wake is not checked",
    Check.UNSUPPORTED: "it does not generate text: there is no answer to check",
}


def _weights_summary(records: Sequence[Integrity]) -> str:
    checked = sum(1 for r in records if r.weights in (Check.RECORDED, Check.VERIFIED))
    unsupported = sum(1 for r in records if r.weights is Check.UNSUPPORTED)
    parts = [f"Weights checked after level-2 wakes on {checked} engine(s)"]
    if unsupported:
        parts.append(f"not on {unsupported}: {NO_CHECKER}")
    return "; ".join(parts)


def known_bug(engines: Sequence[tuple[str, EngineMemory]]) -> Reading:
    """KnownBug: True while an engine's vLLM release and arguments are in the table of known
    sleep and wake bugs, naming the rows and what Snooze does about them."""
    found = [(pod, e) for pod, e in engines if e.conduct is not None and e.conduct.bugs]
    if not found:
        return Reading(
            type="KnownBug",
            status=False,
            reason="NoKnownBug",
            message="no engine's vLLM release and arguments are in Snooze's table of known "
            "sleep and wake bugs",
        )
    pod, engine = found[0]
    assert engine.conduct is not None
    more = f" (and {len(found) - 1} more pods)" if len(found) > 1 else ""
    release = engine.version[1] if engine.version is not None else "release not known yet"
    return Reading(
        type="KnownBug",
        status=True,
        reason="KnownBadCombination",
        message=f"{pod}{more} (vLLM {release}): {engine.conduct.why}. "
        f"{describe(engine.conduct.bugs)}. Set spec.wake.onKnownBug to choose otherwise",
    )
