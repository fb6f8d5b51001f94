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


def test_the_status_written_validates_against_the_crd() -> None:
    """What the API server would check: types, patterns, bounds and required fields, also for
    a model whose generation is not known (no null where the schema wants an integer)."""
    import jsonschema

    from snooze import crd

    schema = crd.status_schema()
    pods = [PodInfo(namespace="ns", name="chat-0", uid="u", labels={}, ip="127.0.0.2", ready=True)]
    for generation in (None, 4):
        built = status.build(
            model_name="chat",
            pods=pods,
            memory=ModelMemory(last_activity=NOW),
            previous={},
            generation=generation,
            now=NOW,
        )
        # Top-level nulls are merge-patch deletions; a null inside a list would be stored.
        jsonschema.validate({k: v for k, v in built.items() if v is not None}, schema)
        assert all(
            ("observedGeneration" in c) == (generation is not None) for c in built["conditions"]
        )
