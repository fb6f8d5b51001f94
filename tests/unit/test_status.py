"""The status the operator writes says only what the CRD's status schema declares."""

from __future__ import annotations

from pydantic import BaseModel

from snooze.kube.pods import PodInfo
from snooze.models import Condition, InferenceModelStatus, PodStatus
from snooze.operator import status
from snooze.operator.memory import EngineMemory, ModelMemory

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
        failure=("chat-1", "HybridKVCacheReinit", "boom"),
    )
    failing = EngineMemory(last_activity=NOW - 100, wake_failures=1, last_failure=NOW - 20)
    failing.last_failure_reason, failing.last_failure_message = "Timeout", "slow"
    failing.state_since["asleep"] = NOW - 30
    memory.engines["chat-1"] = failing
    pods = [
        PodInfo(
            namespace="ns",
            name="chat-1",
            uid="u",
            labels={"snooze.dev/state": "asleep"},
            ip="127.0.0.2",
            ready=True,
        )
    ]
    built = status.build(
        model_name="chat", pods=pods, memory=memory, previous={}, generation=3, now=NOW, replicas=2
    )
    assert set(built) <= wire_names(InferenceModelStatus)
    for pod in built["pods"]:
        assert set(pod) <= wire_names(PodStatus)
    for condition in built["conditions"]:
        assert set(condition) <= wire_names(Condition)
    # And it reads back through the models it was written from.
    read = InferenceModelStatus.model_validate(built)
    assert read.pods[0].failure_reason == "Timeout"
    assert read.scaled_from_replicas == 2


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
    assert status.only_activity_moved(old, moved)
    assert not status.only_activity_moved(old, {**moved, "phase": "Draining"})
    assert not status.only_activity_moved(
        old, {**moved, "pods": [{"name": "a", "state": "draining"}]}
    )
