"""The status's account of wake integrity: each engine's records and checks, the WakeVerified
condition, and the KnownBug condition; pure, so it is tested as data."""

from __future__ import annotations

from collections.abc import Sequence

from snooze.api.conditions import ConditionReason, ConditionType
from snooze.api.modelstatus import OutputRecord, PodVerification
from snooze.operator.memory import EngineMemory, Integrity
from snooze.operator.status.conditions import ConditionValue as Reading
from snooze.policy.integrity import CHECKED, Check
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
    """WakeVerified, saying exactly what is checked: True while every ready engine's next wake
    will be checked and none of its checks could not be asked; False naming the engine and why
    where one's answer is not checked, or its weights could not be asked for or differ;
    Unknown while no engine has been recorded yet (none has slept)."""
    if not verify:
        return Reading(
            type=ConditionType.WAKE_VERIFIED,
            status=False,
            reason=ConditionReason.VERIFICATION_OFF,
            message="spec.wake.verify is false: woken engines serve without being checked",
        )
    records = [(pod, engine.integrity) for pod, engine in engines]
    weights = _weights_summary([integrity for _, integrity in records])
    for state in _WORST:
        found = [(pod, integrity) for pod, integrity in records if integrity.output is state]
        if found:
            return _unverified(found, state.value, _why_not(found[0][1], state), weights)
    answers = _answers_summary([integrity for _, integrity in records])
    for state in _WORST_WEIGHTS:
        found = [(pod, integrity) for pod, integrity in records if integrity.weights is state]
        if found:
            why = f"its weights {_WHY_WEIGHTS[state]}"
            if found[0][1].message:
                why = f"{why}: {found[0][1].message}"
            return _unverified(found, f"Weights{state.value}", why, answers)
    if not records:
        return Reading(
            type=ConditionType.WAKE_VERIFIED,
            status=None,
            reason=ConditionReason.NO_ENGINE,
            message="no engine is ready: there is nothing to check yet",
        )
    if not any(integrity.output in CHECKED for _, integrity in records):
        return Reading(
            type=ConditionType.WAKE_VERIFIED,
            status=None,
            reason=ConditionReason.NOT_RECORDED_YET,
            message="no engine has slept yet: each engine's answer is recorded at its first "
            "sleep, and its wakes are checked from then on",
        )
    return Reading(
        type=ConditionType.WAKE_VERIFIED,
        status=True,
        reason=Check.VERIFIED,
        message=f"{answers}. {weights}",
    )


def _unverified(
    found: Sequence[tuple[str, Integrity]], reason: str, why: str, rest: str
) -> Reading:
    pod = found[0][0]
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    return Reading(
        type=ConditionType.WAKE_VERIFIED,
        status=False,
        reason=reason,
        message=f"{pod}{more}: {why}. {rest}",
    )


def _why_not(integrity: Integrity, state: Check) -> str:
    return integrity.message or _WHY[state]


_WHY = {
    Check.MISMATCH: "it woke answering differently than before its sleep (see WakeFailed)",
    Check.NOT_DETERMINISTIC: "its greedy answer varies between requests: not checked",
    Check.UNAVAILABLE: "its answer could not be asked for",
    Check.MISSED: "it slept with no record of its answer: its next wake is not checked",
    Check.UNSUPPORTED: "it does not generate text: there is no answer to check",
}
_WORST_WEIGHTS = (Check.MISMATCH, Check.UNAVAILABLE)
_WHY_WEIGHTS = {
    Check.MISMATCH: "differ from their digests before its sleep (see WakeFailed)",
    Check.UNAVAILABLE: "could not be asked for",
}


def _count(number: int) -> str:
    return f"{number} engine" + ("" if number == 1 else "s")


def _answers_summary(records: Sequence[Integrity]) -> str:
    """How many engines' answers are checked after each wake, and how many wait for their first
    sleep; never a count of none."""
    checked = sum(1 for r in records if r.output in CHECKED)
    pending = sum(1 for r in records if r.output is Check.PENDING)
    parts = []
    if checked:
        parts.append(f"answers checked after each wake on {checked} of {_count(len(records))}")
    if pending:
        parts.append(f"{_count(pending)} recorded at their first sleep")
    return "; ".join(parts) or "no answer checked"


def _weights_summary(records: Sequence[Integrity]) -> str:
    """Where the weights' digests are recorded (compared after level-2 wakes and failed
    answers), where they wait for a sleep, and where vLLM cannot give them."""
    checked = sum(1 for r in records if r.weights in CHECKED)
    pending = sum(1 for r in records if r.weights is Check.PENDING)
    unsupported = sum(1 for r in records if r.weights is Check.UNSUPPORTED)
    parts = []
    if checked:
        parts.append(
            f"Weights recorded on {_count(checked)}: compared after level-2 wakes and after an "
            "answer that differs"
        )
    if pending:
        parts.append(f"weights of {_count(pending)} recorded at a later sleep")
    if unsupported:
        parts.append(f"weights not checked on {_count(unsupported)}: {NO_CHECKER}")
    summary = "; ".join(parts) or "Weights not checked on any engine"
    return summary[0].upper() + summary[1:]


def known_bug(engines: Sequence[tuple[str, EngineMemory]]) -> Reading:
    """KnownBug: True while an engine's vLLM release and arguments are in the table of known
    sleep and wake bugs, or its release cannot wake from the level it was to sleep at, naming
    the rows and what Snooze does about them."""
    found = [
        (pod, e)
        for pod, e in engines
        if e.conduct is not None and (e.conduct.bugs or e.conduct.refused)
    ]
    if not found:
        return Reading(
            type=ConditionType.KNOWN_BUG,
            status=False,
            reason=ConditionReason.NO_KNOWN_BUG,
            message="no engine's vLLM release and arguments are in Snooze's table of known "
            "sleep and wake bugs",
        )
    pod, engine = found[0]
    conduct = engine.conduct
    assert conduct is not None
    more = f" (and {len(found) - 1} more pods)" if len(found) > 1 else ""
    release = engine.version[1] if engine.version is not None else "release not known yet"
    reason = (
        ConditionReason.KNOWN_BAD_COMBINATION
        if conduct.bugs
        else ConditionReason.LEVEL_NOT_SUPPORTED
    )
    choose = "Set spec.wake.onKnownBug to choose otherwise" if conduct.bugs else "Upgrade vLLM"
    return Reading(
        type=ConditionType.KNOWN_BUG,
        status=True,
        reason=reason,
        message=f"{pod}{more} (vLLM {release}): {conduct.why}. "
        f"{describe(conduct.bugs, conduct.refused)}. {choose}",
    )
