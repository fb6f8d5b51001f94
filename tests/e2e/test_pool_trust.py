"""A GPU pool member that lies about its sleep, end to end: one that answers /sleep but keeps
its memory, and one that says it sleeps though Snooze never put it to sleep. The pool notices
that its books and the device disagree, stops trusting the member, says so, and the neighbour
is served. Clients go through the gateway; the engines are simulated on one shared device,
whose memory is the truth."""

from __future__ import annotations

from typing import Any

import httpx
from gateway_fixtures import GatewayThread, gateway
from waits import wait_for

from snooze.sandbox import Sandbox

from .conftest import FAST, Cluster, OperatorThread
from .test_pool_queue import chat
from .test_pools import Kubelet, device_and_pool, pool_status

__all__ = ["gateway"]
GIB = 2**30


def member_spec(name: str) -> dict[str, Any]:
    return {
        "selector": {"matchLabels": {"app": name}},
        "idle": {"after": "Never"},
        "pool": {"name": "gpu-0", "memory": "30Gi", "asleepMemory": "1Gi"},
        # Report: restarting a member means deleting its pod, which here (no kubelet) would
        # not end its engine nor free its memory; tests/cluster/test_pools.py restarts one.
        "wake": {"timeout": "30s", "onFailure": "Report"},
    }


def wake_ooms(kubelet: Kubelet) -> int:
    return sum(e.memory.oom_total["wake"] for e in kubelet.engines.values())


def untrusted(cluster: Cluster) -> dict[str, bool]:
    return {m["pod"]: m["untrusted"] for m in pool_status(cluster).get("members") or []}


def test_a_member_whose_sleep_keeps_its_memory_is_found_out_and_the_neighbour_served(
    cluster: Cluster, gateway: GatewayThread, operator: OperatorThread
) -> None:
    """a answers /sleep but keeps its 30 GiB. A request for c puts a to sleep (the least
    recently used), c's wake runs out of memory; the pool blames a, whose sleep made that room,
    counts it at its whole footprint from then on, puts b to sleep instead, and c's next wake
    is served: one wake out of memory, not one per retry until c is marked failed."""
    device = device_and_pool(cluster)
    for name in "abc":
        cluster.create_model(name, member_spec(name))
    cluster.patch_model("c", {"spec": {"desiredState": "Asleep"}})
    device.start("c")
    wait_for("c asleep", lambda: device.engines["c"].is_sleeping)
    cluster.patch_model("c", {"spec": {"desiredState": "Auto"}})
    device.start("a", frees_nothing=True)
    device.start("b")
    assert chat(gateway, "b").status_code == 200  # a is the least recently used now

    answer = chat(gateway, "c")
    assert answer.status_code == 200, answer.text
    engines = device.engines
    assert not engines["c"].is_sleeping
    assert engines["a"].is_sleeping and engines["a"].sleep_calls == 1
    assert engines["a"].gpu_memory_bytes == 30 * GIB  # what it said it freed, it kept
    assert engines["b"].is_sleeping  # put to sleep in a's stead
    assert wake_ooms(device) == 1
    events = wait_for("the Event", lambda: cluster.events("MemoryNotFreed"))
    assert events[0]["message"].startswith("a-0 (a) said it slept, but the device did not get")
    assert "c-0 (c) ran out of memory" in events[0]["message"]
    assert wait_for("the status", lambda: untrusted(cluster).get("a-0")) is True
    assert not untrusted(cluster)["b-0"] and not untrusted(cluster)["c-0"]
    # c's own failure says what happened, not that an engine outside the pool holds memory.
    # (The operator writes its Events from a queue, after every other write: waited for.)
    [failed] = wait_for(
        "c's WakeFailed Event", lambda: [e["message"] for e in cluster.events("WakeFailed")]
    )
    assert "GPUPool gpu-0 had counted room for it" in failed, failed
    assert "put it in the same GPUPool" not in failed
    conditions = {c["type"]: c for c in pool_status(cluster)["conditions"]}
    assert conditions["MemoryNotFreed"]["status"] == "True"
    assert "a-0" in conditions["MemoryNotFreed"]["message"]


def test_a_member_asleep_without_snooze_putting_it_to_sleep_blocks_no_start(
    cluster: Cluster, gateway: GatewayThread, sandbox: Sandbox
) -> None:
    """l says it sleeps from before the operator starts, but Snooze never put it to sleep, and
    it keeps its 30 GiB; b is awake. s starts: the pool counts l at its whole footprint, so it
    makes room for s by putting b to sleep, and s loads (it was refused for good: the pool
    counted l at 1 GiB and s as fitting)."""
    device = device_and_pool(cluster)
    for name in ("l", "b", "s"):
        cluster.create_model(name, member_spec(name))
    liar = device.start("l", frees_nothing=True)
    httpx.post(f"{liar.url}/sleep", params={"level": 1}, timeout=10).raise_for_status()
    device.start("b")
    operator = OperatorThread(FAST).start()
    try:
        started = device.start("s", wait=False)
        wait_for("s loaded", lambda: started.loaded, timeout=30)
        assert device.engines["b"].is_sleeping and device.engines["b"].sleep_calls == 1
        assert liar.sleep_calls == 1  # the one by hand
        events = wait_for("the Event", lambda: cluster.events("SleepUnasked"))
        assert [e["message"].split()[0] for e in events] == ["l-0"]
        assert wait_for("the status", lambda: untrusted(cluster).get("l-0")) is True
    finally:
        operator.stop()
