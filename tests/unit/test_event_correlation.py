"""Events told as client-go's EventCorrelator tells them (operator/events/correlation.py): a repeat
is a patch of the Event written before, similar ones are combined, and each object's writes
have a budget; and the Event bodies the recorder writes (operator/events/recorder.py)."""

from __future__ import annotations

from snooze.api.eventreasons import EventReason
from snooze.operator.events.correlation import (
    AGGREGATE_AFTER,
    AGGREGATE_SECONDS,
    BURST,
    COMBINED,
    REFILL_SECONDS,
    Correlator,
    Regarding,
    Told,
    Write,
    event_name,
)
from snooze.operator.events.recorder import event_body

MODEL = Regarding(namespace="llm", kind="InferenceModel", name="chat", uid="u-1", api_version="v")
OTHER = Regarding(namespace="llm", kind="InferenceModel", name="code", uid="u-2", api_version="v")
NOW = 1_800_000_000.0


def told(
    message: str, reason: str = "Woke", about: Regarding = MODEL, kind: str = "Normal"
) -> Told:
    return Told(regarding=about, type=kind, reason=reason, message=message)


def test_the_same_event_again_is_a_patch_of_the_first() -> None:
    correlator = Correlator()
    first = correlator.correlate(told("chat-0: awake"), NOW)
    again = correlator.correlate(told("chat-0: awake"), NOW + 5)
    assert first is not None and again is not None
    assert not first.patch and first.count == 1
    assert again.patch and again.name == first.name and again.count == 2
    assert again.first == NOW and again.last == NOW + 5
    other = correlator.correlate(told("chat-0: awake", reason=EventReason.SLEPT), NOW + 6)
    assert other is not None and not other.patch and other.name != first.name


def test_similar_events_are_combined_after_ten_in_ten_minutes() -> None:
    correlator = Correlator()
    writes = [correlator.correlate(told(f"awake after {i}s"), NOW + i) for i in range(14)]
    assert all(w is not None for w in writes)
    separate = [w for w in writes if w is not None and not w.told.message.startswith(COMBINED)]
    combined = [w for w in writes if w is not None and w.told.message.startswith(COMBINED)]
    assert len(separate) == AGGREGATE_AFTER - 1
    assert [w.count for w in combined] == [1, 2, 3, 4, 5]
    assert len({w.name for w in combined}) == 1
    assert combined[-1].told.message == COMBINED + "awake after 13s"
    # Ten minutes later the group starts afresh.
    later = correlator.correlate(told("awake after 99s"), NOW + 14 + AGGREGATE_SECONDS + 1)
    assert later is not None and later.told.message == "awake after 99s" and not later.patch


def test_each_object_has_a_budget_of_writes_and_repeats_are_still_counted() -> None:
    correlator = Correlator()
    said = [correlator.correlate(told("chat-0: awake"), NOW + i * 0.1) for i in range(BURST + 5)]
    written = [w for w in said if w is not None]
    assert len(written) == BURST
    # Another object, or another type, has a budget of its own.
    assert correlator.correlate(told("code-0: awake", about=OTHER), NOW + 3) is not None
    assert correlator.correlate(told("chat-0: late", kind="Warning"), NOW + 3) is not None
    # One more write after each REFILL_SECONDS, counting what was held back meanwhile.
    refilled = correlator.correlate(told("chat-0: awake"), NOW + 3 + REFILL_SECONDS)
    assert refilled is not None and refilled.count == BURST + 5 + 1
    assert correlator.correlate(told("chat-0: awake"), NOW + 4 + REFILL_SECONDS) is None


def test_a_flapping_model_costs_a_bounded_number_of_writes() -> None:
    correlator = Correlator()
    reasons = ("Draining", "Slept", "Waking", "Woke")
    writes = [
        correlator.correlate(told(f"chat-0: step {i}", reason=reasons[i % 4]), NOW + i)
        for i in range(3600)  # an Event a second for an hour
    ]
    assert sum(1 for w in writes if w is not None) <= BURST + 3600 / REFILL_SECONDS + 1


def test_names_are_the_objects_and_a_time_and_never_too_long() -> None:
    assert event_name(MODEL, 1.5) == f"chat.{1_500_000_000:x}"
    long = Regarding(namespace="llm", kind="InferenceModel", name="m" * 253)
    assert len(event_name(long, NOW)) == 253


def test_the_event_body_is_a_core_event_with_its_count() -> None:
    write = Write(
        told=told("x" * 3000), name="chat.1", count=3, first=NOW, last=NOW + 60, patch=True
    )
    body = event_body(write, instance="op-1")
    assert body["count"] == 3
    assert body["firstTimestamp"] == "2027-01-15T08:00:00.000Z"
    assert body["lastTimestamp"] == "2027-01-15T08:01:00.000Z"
    assert len(body["message"]) <= 1024 and "..." in body["message"]
    assert body["involvedObject"] == {
        "apiVersion": "v",
        "kind": "InferenceModel",
        "name": "chat",
        "namespace": "llm",
        "uid": "u-1",
    }
    assert body["source"] == {"component": "snooze-operator"}
    assert body["reportingComponent"] == "snooze-operator"
