"""A keep-awake window on a GPU pool member, end to end: the window wakes the member once, and
the pool keeps it awake through the window; its neighbours take turns in the room left, and
the member is never put to sleep for them only to be woken again by its window."""

from __future__ import annotations

from typing import Any

from gateway_fixtures import GatewayThread, gateway
from waits import wait_for

from .conftest import Cluster, OperatorThread
from .test_keepawake import daily_from_now
from .test_pool_queue import chat
from .test_pools import device_and_pool

__all__ = ["gateway"]


def member_spec(name: str, **more: Any) -> dict[str, Any]:
    return {
        "selector": {"matchLabels": {"app": name}},
        "idle": {"after": "Never"},
        "pool": {"name": "gpu-0", "memory": "30Gi", "asleepMemory": "1Gi"},
        **more,
    }


def test_a_member_kept_awake_by_its_window_is_not_put_to_sleep_for_its_neighbours(
    cluster: Cluster, gateway: GatewayThread, operator: OperatorThread
) -> None:
    """k's window (an hour, minAwake 10000) starts while n1 and n2 fill the pool: one of them
    sleeps for k. Then requests alternate between n1 and n2, the one used last awake: each
    puts the other to sleep. k, the least recently used, was put to sleep for them (the pool
    did not see its window), and its window woke it again at once, putting a neighbour to
    sleep, round after round."""
    device = device_and_pool(cluster)
    cluster.create_model("n1", member_spec("n1"))
    cluster.create_model("n2", member_spec("n2"))
    cluster.create_model("k", member_spec("k", desiredState="Asleep"))
    device.start("k")
    wait_for("k asleep", lambda: device.engines["k"].is_sleeping)
    device.start("n1")
    device.start("n2")
    window = {"name": "hour", "cron": daily_from_now(3), "duration": "1h", "minAwake": 10000}
    cluster.patch_model("k", {"spec": {"desiredState": "Auto", "schedule": [window]}})
    k = device.engines["k"]
    wait_for("k woken by its window", lambda: not k.is_sleeping, timeout=30)
    assert k.wake_calls == 1
    k_slept = k.sleep_calls  # its sleep before the window

    for _ in range(3):
        awake = next(n for n in ("n1", "n2") if not device.engines[n].is_sleeping)
        asleep = "n2" if awake == "n1" else "n1"
        assert chat(gateway, awake).status_code == 200  # k is the least recently used now
        answer = chat(gateway, asleep)
        assert answer.status_code == 200, answer.text
        assert not k.is_sleeping
    assert k.sleep_calls == k_slept and k.wake_calls == 1
    slept = device.engines["n1"].sleep_calls + device.engines["n2"].sleep_calls
    assert slept == 4  # one for k's window, then one per request for the sleeping neighbour
