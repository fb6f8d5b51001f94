"""The status the operator writes says only what the CRD's status schema declares."""

from __future__ import annotations

from builders import pod_info
from pydantic import BaseModel

from snooze.api.modelstatus import (
    Condition,
    InferenceModelStatus,
    PodStatus,
    merge_patch,
    parse_status,
)
from snooze.api.reasons import FailureReason
from snooze.kube.pods import PodInfo
from snooze.operator.memory import EngineMemory, ModelMemory
from snooze.operator.status import model as status

NOW = 1_800_000_000.0


def wire_names(model: type[BaseModel]) -> set[str]:
    return {field.alias or name for name, field in model.model_fields.items()}


def test_every_written_field_is_in_the_models() -> None:
    memory = ModelMemory(
        last_activity=NOW - 100,
        last_sleep_time=NOW - 50,
        last_wake_time=NOW - 10,
        last_wake_seconds=0.3,
        scaled_from=2,
        scaled_at=NOW - 5,
        manual_at=NOW - 4,
        scale_up_time=NOW - 3,
        failure=("chat-1", FailureReason.HYBRID_KV_CACHE_REINIT, "boom"),
    )
    failing = EngineMemory(last_activity=NOW - 100, wake_failures=1, last_failure=NOW - 20)
    failing.last_failure_reason, failing.last_failure_message = "Timeout", "slow"
    failing.state_since["asleep"] = NOW - 30
    memory.engines["chat-1"] = failing
    pods = [pod_info("chat-1", uid="u", state="asleep", ip="127.0.0.2")]
    built = status.build(
        model_name="chat",
        pods=pods,
        memory=memory,
        previous=InferenceModelStatus(),
        generation=3,
        now=NOW,
        replicas=2,
    )
    written = merge_patch(built)
    assert set(written) <= wire_names(InferenceModelStatus)
    for pod in written["pods"]:
        assert set(pod) <= wire_names(PodStatus)
    for condition in written["conditions"]:
        assert set(condition) <= wire_names(Condition)
    # And it reads back through the models it was written from, as it was built.
    read = parse_status(written)
    assert read.pods[0].failure_reason == "Timeout"
    assert read.scaled_from_replicas == 2
    assert read == built


def test_only_activity_moved_tells_traffic_from_news() -> None:
    old = {
        "phase": "Awake",
        "lastActivityTime": "2026-01-01T00:00:00.000Z",
        "pods": [{"name": "a", "state": "awake", "lastActivityTime": "2026-01-01T00:00:00.000Z"}],
    }
    moved = {
        **old,
        "lastActivityTime": "2026-01-01T00:00:30.000Z",
        "pods": [{"name": "a", "state": "awake", "lastActivityTime": "2026-01-01T00:00:30.000Z"}],
    }
    before = parse_status(old)
    assert status.only_activity_moved(before, parse_status(moved))
    assert not status.only_activity_moved(before, parse_status({**moved, "phase": "Draining"}))
    assert not status.only_activity_moved(
        before, parse_status({**moved, "pods": [{"name": "a", "state": "draining"}]})
    )


def test_the_status_written_validates_against_the_crd() -> None:
    """What the API server would check: types, patterns, bounds and required fields, also for
    a model whose generation is not known (no null where the schema wants an integer)."""
    import jsonschema

    from snooze.api import crd

    schema = crd.status_schema()
    pods = [pod_info("chat-0", uid="u", ip="127.0.0.2")]
    for generation in (None, 4):
        built = status.build(
            model_name="chat",
            pods=pods,
            memory=ModelMemory(last_activity=NOW),
            previous=InferenceModelStatus(),
            generation=generation,
            now=NOW,
        )
        written = merge_patch(built)
        # Top-level nulls are merge-patch deletions; a null inside a list would be stored.
        assert not any(None in (c or {}).values() for c in written["conditions"] + written["pods"])
        jsonschema.validate({k: v for k, v in written.items() if v is not None}, schema)
        assert all(
            ("observedGeneration" in c) == (generation is not None) for c in written["conditions"]
        )


def _pod(name: str, state: str | None, *, ready: bool = True) -> PodInfo:
    return pod_info(name, state=state, ip="127.0.0.2", ready=ready)


def _conditions(
    pods: list[PodInfo], memory: ModelMemory | None = None, **kw: object
) -> dict[str, tuple[str, str]]:
    built = status.build(
        model_name="chat",
        pods=pods,
        memory=memory or ModelMemory(last_activity=NOW),
        previous=InferenceModelStatus(),
        generation=1,
        now=NOW,
        selector="app=chat",
        namespace="ns",
        **kw,  # type: ignore[arg-type]
    )
    return {c.type: (c.status, c.reason) for c in built.conditions}


def test_ready_means_it_can_serve_and_awake_means_awake() -> None:
    asleep = [_pod("a", "asleep"), _pod("b", "asleep")]
    assert _conditions(asleep)["Ready"] == ("True", "AbleToWake")
    assert _conditions(asleep)["Awake"] == ("False", "NoEngineAwake")
    assert _conditions(asleep, can_wake=False)["Ready"] == ("False", "WakeDisabled")
    mixed = [_pod("a", "awake"), _pod("b", "asleep")]
    assert _conditions(mixed)["Ready"] == ("True", "EnginesAwake")
    assert _conditions(mixed)["Awake"] == ("True", "EnginesAwake")
    assert _conditions([_pod("a", "waking")])["Ready"] == ("True", "Waking")
    assert _conditions([_pod("a", "failed")])["Ready"] == ("False", "WakeFailed")
    assert _conditions([_pod("a", "awake", ready=False)])["Ready"] == ("False", "NoEngines")
    assert _conditions([])["Ready"] == ("False", "NoPods")
    at_zero = ModelMemory(last_activity=NOW, scaled_from=2)
    assert _conditions([], at_zero)["Ready"] == ("True", "ScaledToZero")
    assert _conditions([], at_zero, can_wake=False)["Ready"] == ("False", "ScaledToZero")
    assert _conditions(asleep, spec_error="bad")["Ready"] == ("False", "InvalidSpec")
    taken = status.Conflicts(model_name="chat", name_taken=True)
    assert _conditions(mixed, conflicts=taken)["Ready"] == ("False", "ModelNameTaken")
