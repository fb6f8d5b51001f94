"""What a woken engine's checks mean: its answer to a fixed greedy request recorded before its
first sleep, the same request after each wake, and its weights' digests; pure.

An answer is its token ids (vLLM 0.10.2+ returns them) or, from an engine that does not say
them, a digest of its text. The first record is taken twice: a model whose greedy answer varies
between two requests is not checked at all, rather than failed at every wake.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

MAX_SHOWN = 8
"""Token ids shown in a message; the rest elided."""


class Check(StrEnum):
    """Where one of an engine's checks stands (status.pods[].verification)."""

    OFF = "Off"
    """spec.wake.verify is false."""
    PENDING = "Pending"
    """Nothing recorded yet: it is recorded at the engine's first sleep."""
    RECORDED = "Recorded"
    """Recorded before a sleep; the next wake is checked against it."""
    VERIFIED = "Verified"
    """The last wake was checked and matched."""
    MISMATCH = "Mismatch"
    """The last wake did not match: the engine is never routed to again."""
    NOT_DETERMINISTIC = "NotDeterministic"
    """Its greedy answer varies from request to request: not checked (no false alarms)."""
    UNSUPPORTED = "Unsupported"
    """The engine cannot be asked (no /weight_checker before vLLM 0.32; a model that does not
    generate text)."""
    UNAVAILABLE = "Unavailable"
    """Asking failed (an error, a timeout, an API key the operator does not have)."""
    MISSED = "Missed"
    """The engine went to sleep with nothing recorded (the operator restarted before it could
    write its record): its wakes are not checked until it is recorded at a later sleep."""


CHECKED = (Check.RECORDED, Check.VERIFIED)
"""States in which the next wake is compared."""


@dataclass(frozen=True, kw_only=True)
class Answer:
    """An engine's answer to the greedy request."""

    route: str
    tokens: tuple[int, ...] | None
    text_sha256: str

    @classmethod
    def of(cls, *, route: str, tokens: Sequence[int] | None, text: str) -> Answer:
        digest = hashlib.sha256(text.encode()).hexdigest()
        return cls(
            route=route, tokens=None if tokens is None else tuple(tokens), text_sha256=digest
        )

    def same_as(self, other: Answer) -> bool:
        """The same answer: the same token ids, or the same text where either has no ids."""
        if self.tokens is not None and other.tokens is not None:
            return self.tokens == other.tokens
        return self.text_sha256 == other.text_sha256

    def shown(self) -> str:
        if self.tokens is None:
            return f"text sha256 {self.text_sha256[:12]}"
        head = ", ".join(str(t) for t in self.tokens[:MAX_SHOWN])
        more = ", ..." if len(self.tokens) > MAX_SHOWN else ""
        return f"tokens [{head}{more}]"


def recorded(first: Answer, second: Answer) -> Check:
    """The state a first record leaves: RECORDED, or NOT_DETERMINISTIC when two greedy
    answers taken one after the other already differ."""
    return Check.RECORDED if first.same_as(second) else Check.NOT_DETERMINISTIC


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """What a wake's answers say against the record."""

    state: Check
    """VERIFIED, MISMATCH, or NOT_DETERMINISTIC (the second answer matched the record
    where the first did not: the model varies, and is not checked from now on)."""
    message: str

    @property
    def failed(self) -> bool:
        return self.state is Check.MISMATCH


def judge(baseline: Answer, first: Answer, second: Answer | None) -> Verdict:
    """Pure: the verdict on a wake whose greedy answer was `first`, and `second` when the
    first differed (asked once more before failing the wake)."""
    if first.same_as(baseline):
        return Verdict(
            state=Check.VERIFIED, message=f"answered as before its sleep ({first.shown()})"
        )
    if second is not None and second.same_as(baseline):
        return Verdict(
            state=Check.NOT_DETERMINISTIC,
            message=f"answered {first.shown()}, then as before its sleep: its greedy answer "
            "varies, so its wakes are not checked any more",
        )
    return Verdict(
        state=Check.MISMATCH,
        message=f"answers differently than before its sleep: {baseline.shown()} before, "
        f"{first.shown()} now",
    )


def weights_verdict(
    baseline_digest: str,
    baseline_count: int,
    digest: str,
    mismatches: Sequence[str] | None,
) -> Verdict:
    """Pure: the verdict on the weights' digests after a wake; `mismatches` names the tensors
    that differ when the full record was at hand (None: only the overall digest was kept)."""
    if digest == baseline_digest:
        return Verdict(
            state=Check.VERIFIED,
            message=f"its {baseline_count} weight tensors match their digests before its sleep",
        )
    if mismatches:
        shown = ", ".join(mismatches[:3]) + (", ..." if len(mismatches) > 3 else "")
        what = f"{len(mismatches)} of {baseline_count} weight tensors differ ({shown})"
    else:
        what = "its weights' digest differs from the one before its sleep"
    return Verdict(state=Check.MISMATCH, message=what)
