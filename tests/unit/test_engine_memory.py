"""An engine's memory belongs to one pod: gone with it, and not inherited by a namesake."""

from __future__ import annotations

from snooze.kube.pods import PodInfo
from snooze.operator.memory import ModelMemory, rebuild


def pod(name: str, uid: str) -> PodInfo:
    return PodInfo(namespace="default", name=name, uid=uid, labels={}, ip=None, ready=True)


def test_a_pod_recreated_under_its_name_starts_with_no_failures() -> None:
    memory = ModelMemory()
    engine = memory.engine("chat-0", now=0.0)
    memory.forget_missing([pod("chat-0", "uid-1")])
    engine.wake_failures, engine.deleted = 2, True
    memory.forget_missing([pod("chat-0", "uid-1")])
    assert memory.engines["chat-0"] is engine

    memory.forget_missing([pod("chat-0", "uid-2")])
    fresh = memory.engine("chat-0", now=1.0)
    assert fresh is not engine
    assert (fresh.wake_failures, fresh.deleted) == (0, False)


def test_a_missing_pod_is_forgotten() -> None:
    memory = ModelMemory()
    memory.engine("chat-0", now=0.0)
    memory.engine("chat-1", now=0.0)
    memory.forget_missing([pod("chat-1", "uid-1")])
    assert set(memory.engines) == {"chat-1"}


def test_a_pod_recreated_while_the_operator_was_down_is_a_new_engine() -> None:
    status = {
        "pods": [
            {
                "name": "chat-0",
                "uid": "uid-1",
                "state": "asleep",
                "lastActivityTime": "2026-12-03T10:00:00Z",
                "wakeFailures": 1,
                "failureReason": "HybridKVCacheReinit",
            }
        ]
    }
    same = rebuild(status)
    same.forget_missing([pod("chat-0", "uid-1")])
    assert same.engines["chat-0"].wake_failures == 1  # the same pod: its failures stand

    recreated = rebuild(status)
    recreated.forget_missing([pod("chat-0", "uid-2")])
    assert "chat-0" not in recreated.engines
