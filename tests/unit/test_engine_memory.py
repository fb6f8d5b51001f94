"""An engine's memory belongs to one pod: gone with it, and not inherited by a namesake."""

from __future__ import annotations

from builders import pod_info

from snooze.api.modelstatus import parse_status
from snooze.operator.memory import EngineMemory, ModelMemory, rebuild
from snooze.policy.pool.decision import RECENT_WINDOW_SECONDS


def test_a_pod_recreated_under_its_name_starts_with_no_failures() -> None:
    memory = ModelMemory()
    engine = memory.engine("chat-0", now=0.0)
    memory.forget_missing([pod_info("chat-0", uid="uid-1")])
    engine.wake_failures, engine.deleted = 2, True
    memory.forget_missing([pod_info("chat-0", uid="uid-1")])
    assert memory.engines["chat-0"] is engine

    memory.forget_missing([pod_info("chat-0", uid="uid-2")])
    fresh = memory.engine("chat-0", now=1.0)
    assert fresh is not engine
    assert (fresh.wake_failures, fresh.deleted) == (0, False)


def test_a_missing_pod_is_forgotten() -> None:
    memory = ModelMemory()
    memory.engine("chat-0", now=0.0)
    memory.engine("chat-1", now=0.0)
    memory.forget_missing([pod_info("chat-1", uid="uid-1")])
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
    same = rebuild(parse_status(status))
    same.forget_missing([pod_info("chat-0", uid="uid-1")])
    assert same.engines["chat-0"].wake_failures == 1  # the same pod: its failures stand

    recreated = rebuild(parse_status(status))
    recreated.forget_missing([pod_info("chat-0", uid="uid-2")])
    assert "chat-0" not in recreated.engines


def test_recent_requests_count_what_the_success_counter_moved_in_the_window() -> None:
    engine = EngineMemory(last_activity=0.0)
    # The probe loop notes each total, then keeps it as the engine's last.
    for at, total in ((0.0, 100.0), (10.0, 103.0), (20.0, 103.0), (300.0, 110.0)):
        engine.note_served(total, at)
        engine.success_total = total
    # The first total is the past (counted before the operator looked); then 3 and 7.
    assert engine.recent_requests(300.0) == 10
    # A restarted engine's counter starts again from zero: what it shows is new.
    engine.note_served(2.0, 310.0)
    engine.success_total = 2.0
    assert engine.recent_requests(310.0) == 12
    # Ten minutes on, only what came within them counts.
    assert engine.recent_requests(10.0 + RECENT_WINDOW_SECONDS) == 9
    engine.note_served(2.0, 400.0 + RECENT_WINDOW_SECONDS)
    assert engine.recent_requests(400.0 + RECENT_WINDOW_SECONDS) == 0
    assert not engine.served  # forgotten, not only left uncounted
