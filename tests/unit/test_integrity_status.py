"""What the status says of wake integrity: each engine's records (which a restarted operator
reads back), and the WakeVerified and KnownBug conditions."""

from __future__ import annotations

import pytest
from builders import pod_info

from snooze.api.modelstatus import (
    InferenceModelStatus,
    PodStatus,
    PodVerification,
    merge_patch,
    parse_status,
)
from snooze.operator.memory import EngineMemory, Integrity, ModelMemory, integrity_of, rebuild
from snooze.operator.status import model as status
from snooze.operator.status.integrity import known_bug, verification_entry, wake_verified
from snooze.policy.integrity import Answer, Check
from snooze.policy.knownbugs import ServeFacts, conduct
from snooze.policy.runs import Process

from .test_status import wire_names

NOW = 1_800_000_000.0
BASELINE = Answer.of(route="/v1/completions", tokens=[5, 6, 7, 8], text="five six")


def engine(**integrity: object) -> EngineMemory:
    memory = EngineMemory(last_activity=NOW)
    memory.integrity = Integrity(process=Process("uid-1", 2), **integrity)  # type: ignore[arg-type]
    return memory


def test_the_records_go_on_the_status_and_come_back_after_a_restart() -> None:
    recorded = engine(
        output=Check.RECORDED,
        weights=Check.RECORDED,
        baseline=BASELINE,
        weights_digest="d" * 64,
        weights_count=290,
        weights_full={"x": "y"},
    )
    memory = ModelMemory()
    memory.engines["chat-0"] = recorded
    built = status.build(
        model_name="chat",
        pods=[pod_info("chat-0", uid="uid-1", state="asleep")],
        memory=memory,
        previous=InferenceModelStatus(),
        generation=1,
        now=NOW,
    )
    written = merge_patch(built)
    entry = written["pods"][0]["verification"]
    assert entry == {
        "output": "Recorded",
        "weights": "Recorded",
        "restarts": 2,
        "baseline": {
            "route": "/v1/completions",
            "textSha256": BASELINE.text_sha256,
            "tokens": [5, 6, 7, 8],
        },
        "weightsDigest": "d" * 64,
        "weightTensors": 290,
    }
    assert set(entry) <= wire_names(PodVerification)
    again = rebuild(parse_status(written)).engines["chat-0"].integrity
    assert again.of(Process("uid-1", 2)) and not again.of(Process("uid-1", 3))
    assert (again.output, again.weights, again.baseline) == (
        Check.RECORDED,
        Check.RECORDED,
        BASELINE,
    )
    assert (again.weights_digest, again.weights_count, again.route) == (
        "d" * 64,
        290,
        "/v1/completions",
    )
    assert again.weights_full is None  # the full map stays in memory: too large for a status
    assert not again.quarantined


def test_a_mismatch_read_back_is_still_a_quarantine() -> None:
    def read(entry: dict[str, object]) -> PodStatus:
        [found] = parse_status({"pods": [{"name": "chat-0", "state": "asleep", **entry}]}).pods
        return found

    mismatch = {"output": "Mismatch", "restarts": 0}
    assert integrity_of(read({"uid": "u", "verification": mismatch})).quarantined
    assert not integrity_of(read({"verification": {"output": "Mismatch"}})).quarantined
    assert integrity_of(read({"uid": "u", "verification": {"output": "Bogus"}})).output is (
        Check.PENDING
    )


def test_verification_off_says_so() -> None:
    off_entry = verification_entry(engine(), verify=False)
    assert off_entry.model_dump(by_alias=True, exclude_unset=True) == {
        "output": "Off",
        "weights": "Off",
    }
    off = wake_verified([("chat-0", engine())], verify=False)
    assert (off.status, off.reason) == (False, "VerificationOff")


@pytest.mark.parametrize(
    ("states", "ok", "reason"),
    [
        ([Check.RECORDED, Check.VERIFIED], True, "Verified"),
        ([Check.RECORDED, Check.PENDING], True, "Verified"),
        ([Check.PENDING], None, "NotRecordedYet"),  # Unknown: nothing has been checked yet
        ([Check.VERIFIED, Check.NOT_DETERMINISTIC], False, "NotDeterministic"),
        ([Check.MISSED, Check.UNAVAILABLE], False, "Unavailable"),
        ([Check.UNSUPPORTED], False, "Unsupported"),
        ([Check.MISMATCH, Check.NOT_DETERMINISTIC], False, "Mismatch"),
    ],
)
def test_wake_verified_says_the_worst_first(
    states: list[Check], ok: bool | None, reason: str
) -> None:
    engines = [(f"chat-{i}", engine(output=s)) for i, s in enumerate(states)]
    found = wake_verified(engines, verify=True)
    assert (found.status, found.reason) == (ok, reason)


def test_wake_verified_says_where_weights_are_not_checked() -> None:
    found = wake_verified(
        [("a", engine(output=Check.RECORDED, weights=Check.UNSUPPORTED))], verify=True
    )
    assert "not checked on 1 engine: no /weight_checker (vLLM 0.32.0 and later" in found.message


def test_wake_verified_is_not_true_while_a_weights_check_could_not_be_asked() -> None:
    unasked = engine(
        output=Check.RECORDED,
        weights=Check.UNAVAILABLE,
        message="the check could not be made (not asked again until the engine restarts): ...",
    )
    found = wake_verified([("a", engine(output=Check.VERIFIED)), ("b", unasked)], verify=True)
    assert (found.status, found.reason) == (False, "WeightsUnavailable")
    assert found.message.startswith("b: its weights could not be asked for: the check could")
    assert "answers checked after each wake on 2 of 2 engines" in found.message


def test_wake_verified_is_unknown_where_there_is_no_engine() -> None:
    """A model with no pods: nothing is checked, so nothing is claimed (not "True ... on 0
    engine(s)")."""
    found = wake_verified([], verify=True)
    assert (found.status, found.reason) == (None, "NoEngine")
    assert "0 engine" not in found.message


@pytest.mark.parametrize("output", list(Check))
@pytest.mark.parametrize("weights", list(Check))
def test_wake_verified_never_claims_a_check_on_no_engine(output: Check, weights: Check) -> None:
    """Whatever the states, the message counts only what was checked (never "on 0 engines"),
    and True only when every answer is checked and no weights check failed to be asked."""
    engines = [("a", engine(output=output, weights=weights)), ("b", engine())]
    found = wake_verified(engines, verify=True)
    assert " 0 engine" not in found.message and "on 0" not in found.message
    if found.status:
        assert output in (Check.RECORDED, Check.VERIFIED)
        assert weights not in (Check.UNAVAILABLE, Check.MISMATCH)
    if found.status is None:  # Unknown: only while no answer has been recorded anywhere
        assert output not in (Check.RECORDED, Check.VERIFIED)


def test_known_bug_names_the_pod_release_rows_and_conduct() -> None:
    bugged = engine()
    facts = ServeFacts(version="0.28.0", lora=True, tensor_parallel=2)
    bugged.version = (Process("uid-1", 2), "0.28.0")
    bugged.conduct = conduct(facts, 1, "FallBack")
    found = known_bug([("chat-0", bugged), ("chat-1", engine())])
    assert (found.status, found.reason) == (True, "KnownBadCombination")
    assert found.message.startswith("chat-0 (vLLM 0.28.0): sleeps at level 2 instead of 1")
    assert "vllm#53888" in found.message and "onKnownBug" in found.message
    none = known_bug([("chat-1", engine())])
    assert (none.status, none.reason) == (False, "NoKnownBug")


def test_known_bug_says_a_refused_level_and_the_release_it_needs() -> None:
    refused = engine()
    facts = ServeFacts(version="0.9.2")
    refused.conduct = conduct(facts, 2, "FallBack")
    refused.version = (Process("uid-1", 2), "0.9.2")
    found = known_bug([("chat-0", refused)])
    assert (found.status, found.reason) == (True, "LevelNotSupported")
    assert found.message.startswith(
        "chat-0 (vLLM 0.9.2): sleep level 2 needs vLLM 0.10.2 or later: sleeps at level 1 "
        "instead of 2. level 2: a level-2 wake must reload"
    )
    assert found.message.endswith("Upgrade vLLM")
