"""What a model's or a pod's event shows the loops: the operator's own writes change none of
it, so their echoes poke no loop; what the loops read does."""

from __future__ import annotations

from builders import pod_info

from snooze.api.agreed import STATE_LABEL
from snooze.api.models import EngineState
from snooze.kube.pods import PodInfo
from snooze.operator.model.foresight import ToldWindow
from snooze.operator.sightings import ModelSighting, PodSighting
from snooze.policy.claims import Claim

CLAIM = ("qwen", Claim(namespace="ns", name="m", created="2026-01-01T00:00:00Z", holds=True))


def body(**meta: object) -> dict[str, object]:
    return {
        "metadata": {"name": "m", "namespace": "ns", "generation": 1, **meta},
        "status": {"phase": "Awake"},
    }


def test_a_status_write_leaves_a_model_as_seen() -> None:
    seen = ModelSighting.of(body(), CLAIM)
    written = {**body(), "status": {"phase": "Asleep", "awake": 0}}
    assert ModelSighting.of(written, CLAIM) == seen
    assert seen.claimed_name() == "qwen"


def test_what_a_model_loop_reads_changes_its_sighting() -> None:
    seen = ModelSighting.of(body(), CLAIM)
    assert ModelSighting.of(body(generation=2), CLAIM).generation == 2
    assert ModelSighting.of(body(generation=2), CLAIM) != seen
    assert ModelSighting.of(body(annotations={"a": "b"}), CLAIM) != seen
    assert ModelSighting.of(body(deletionTimestamp="2026-01-01T00:00:01Z"), CLAIM) != seen
    assert ModelSighting.of(body(), None) != seen
    assert ModelSighting.of(body(), None).claimed_name() is None


def pod(**labels: str) -> PodInfo:
    return pod_info("p", uid="u1", labels=labels, ip="10.0.0.1")


def test_the_state_label_is_no_part_of_a_pod_sighting() -> None:
    seen = PodSighting.of(pod(app="a", **{STATE_LABEL: EngineState.AWAKE}), deleted=False)
    relabelled = pod(app="a", **{STATE_LABEL: EngineState.ASLEEP})
    assert PodSighting.of(relabelled, deleted=False) == seen
    assert seen.labels == (("app", "a"),)


def test_what_routing_and_selection_read_changes_a_pod_sighting() -> None:
    seen = PodSighting.of(pod(app="a"), deleted=False)
    assert PodSighting.of(pod(app="b"), deleted=False) != seen
    assert PodSighting.of(pod(app="a"), deleted=True) != seen
    moved = pod_info("p", uid="u1", labels={"app": "a"}, ip="10.0.0.2")
    assert PodSighting.of(moved, deleted=False) != seen


def test_a_window_restored_from_the_status_is_the_same_within_a_millisecond() -> None:
    told = ToldWindow(name="day", end=1000.0)
    assert told.same(ToldWindow(name="day", end=1000.0004))
    assert not told.same(ToldWindow(name="day", end=1000.5))
    assert not told.same(ToldWindow(name="night", end=1000.0))
    assert not told.same(ToldWindow(name="day", end=None))
