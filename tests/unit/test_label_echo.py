"""The operator reads a pod's state label from its own last write while the pod index has not
seen that write yet, so that a lagging index does not make it write the same label again."""

from __future__ import annotations

from builders import pod_info

from snooze.api.models import EngineState
from snooze.kube.pods import PodInfo
from snooze.operator.memory import EngineMemory


def pod(version: str, state: str | None = None) -> PodInfo:
    """chat-0 read at this resourceVersion, with this state label (the tests' two axes)."""
    return pod_info(labels={"app": "chat"}, state=state, resource_version=version)


def test_versions_before_the_last_write_read_as_that_write() -> None:
    engine = EngineMemory(last_activity=0.0)
    # A sleep: the draining label (decided on version 40), an annotation, the asleep label
    # (written by the same action, which still holds the pod as it was at version 40).
    engine.wrote(before="40", after="41")
    engine.published = EngineState.DRAINING
    assert engine.label_of(pod("40", "awake")) is EngineState.DRAINING
    engine.wrote(before="40", after="42")
    engine.wrote(before="40", after="43")
    engine.published = EngineState.ASLEEP
    for stale in ("40", "41", "42"):
        assert engine.label_of(pod(stale, "draining")) is EngineState.ASLEEP, stale
    assert engine.label_of(pod("43", "asleep")) is EngineState.ASLEEP


def test_a_version_this_process_did_not_make_is_the_truth() -> None:
    engine = EngineMemory(last_activity=0.0)
    engine.wrote(before="40", after="41")
    engine.published = EngineState.AWAKE
    # Someone removed or changed the label after the write: the operator sees it (and the
    # policy labels the pod again).
    assert engine.label_of(pod("44")) is None
    assert engine.label_of(pod("45", "asleep")) is EngineState.ASLEEP


def test_nothing_written_yet_reads_the_index() -> None:
    engine = EngineMemory(last_activity=0.0)
    assert engine.label_of(pod("7", "draining")) is EngineState.DRAINING
    assert engine.label_of(pod("")) is None
