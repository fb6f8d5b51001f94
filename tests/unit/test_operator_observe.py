"""What a probe's answer notes on a model's memory: when its idle clocks start."""

from __future__ import annotations

from snooze.api.models import parse_spec
from snooze.kube.pods import pod_info
from snooze.operator.memory import EngineMemory, ModelMemory
from snooze.operator.model.observe import Probe, note_answer
from snooze.policy.brakes import Pace

SPEC = parse_spec({"selector": {"matchLabels": {"app": "m"}}})
CREATED = 100.0


def answer(memory: ModelMemory, name: str, now: float) -> EngineMemory:
    engine = memory.engines.setdefault(name, EngineMemory(last_activity=CREATED))
    pod = pod_info({"metadata": {"name": name, "namespace": "ns", "labels": {"app": "m"}}})
    note_answer(
        memory,
        engine,
        pod,
        SPEC,
        Probe(pod=name, sleeping=False, success_total=0.0),
        traffic=None,
        probed_at=now,
        now=now,
        pace=Pace.of(1.0),
    )
    return engine


def test_the_idle_clocks_start_when_the_first_engine_answers_not_at_creation() -> None:
    # Pods that load for 15 minutes: a scaleToZeroAfter of 10 minutes counted from the
    # model's creation would take it to zero right after its first sleep.
    memory = ModelMemory(last_activity=CREATED)
    engine = answer(memory, "m-0", now=CREATED + 900)
    assert engine.last_activity == memory.last_activity == CREATED + 900


def test_a_pod_restarted_later_is_no_activity_of_the_model() -> None:
    memory = ModelMemory(last_activity=CREATED)
    answer(memory, "m-0", now=CREATED + 10)
    restarted = answer(memory, "m-1", now=CREATED + 5000)
    assert restarted.last_activity == CREATED + 5000  # its own idle clock starts
    assert memory.last_activity == CREATED + 10  # the model's does not move
