"""Who waits and who is served on a GPU pool, end to end: a wake that cannot be served now (the
member whose room it needs is busy, or is its own model's sibling) holds back no later wake
that can be, and a wake whose clients all gave up puts nobody to sleep. Clients go through the
gateway; the engines are simulated on one shared device; the operator reads the gateway's
counters as the chart has it do."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import httpx
import pytest
from gateway_fixtures import GatewayThread, gateway
from waits import wait_for

from snooze.sandbox import Sandbox

from .conftest import FAST, Cluster, OperatorThread
from .test_gateway import MESSAGES
from .test_gateway_traffic import metrics_served
from .test_pools import Kubelet, device_and_pool, pool_status

__all__ = ["gateway"]
GIB = 2**30
# p's stream: longer than a held request's wake timeout, so that a wake waiting for p to
# finish is answered 504 (its client's error) before p is idle.
STREAM_TOKENS = 240
TOKEN_SECONDS = 0.05
WAKE_TIMEOUT = "8s"


def member_spec(name: str, memory: str, **pool: Any) -> dict[str, Any]:
    return {
        "selector": {"matchLabels": {"app": name}},
        "idle": {"after": "Never"},  # asleep only when the pool needs the room
        "pool": {"name": "gpu-0", "memory": memory, "asleepMemory": "1Gi", **pool},
        "wake": {"timeout": WAKE_TIMEOUT},
    }


@pytest.fixture
def device(cluster: Cluster) -> Kubelet:
    return device_and_pool(cluster)


@pytest.fixture
def operator_reading(gateway: GatewayThread, sandbox: Sandbox) -> Iterator[OperatorThread]:
    """The operator, reading the gateway's counters (requests held per model among them)."""
    with metrics_served(gateway.g.metrics) as url:
        operator = OperatorThread(replace(FAST, gateway_metrics=(url,))).start()
        try:
            yield operator
        finally:
            operator.stop()


def chat(gw: GatewayThread, model: str, tokens: int = 2, timeout: float = 30) -> httpx.Response:
    body = {"model": model, "messages": MESSAGES, "max_tokens": tokens}
    return httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=timeout)


def gives_up(gw: GatewayThread, model: str, after: float) -> str:
    """A client that stops waiting after `after` seconds; what it got."""
    try:
        return str(chat(gw, model, timeout=after).status_code)
    except httpx.ReadTimeout:
        return "gave up"


def slept(kubelet: Kubelet) -> dict[str, int]:
    return {name: e.sleep_calls for name, e in kubelet.engines.items()}


def test_a_wake_that_must_wait_for_a_busy_member_holds_back_no_other(
    cluster: Cluster,
    device: Kubelet,
    gateway: GatewayThread,
    operator_reading: OperatorThread,
) -> None:
    """The finding: p (8 GiB, priority 1000) serves a long stream; a (30 GiB) and b are idle;
    c (30 GiB) and d (60 GiB) sleep. d cannot wake while p serves, and its client gives up;
    c, asked after d, is served at once by putting a or b to sleep (it got 504 after its wake
    timeout while d's wake stalled the pool). Once p is idle, d's wake, whose client left,
    puts nobody to sleep: nobody waits for it."""
    cluster.create_model("p", member_spec("p", "8Gi", priority=1000))
    for name in "abc":
        cluster.create_model(name, member_spec(name, "30Gi"))
    cluster.create_model("d", member_spec("d", "60Gi"))
    device.start("d", gpu_memory_gib=20, kv_cache_gib=39)
    device.start("c")  # the pool puts d to sleep for it
    device.start("p", gpu_memory_gib=3, kv_cache_gib=4, token_seconds=TOKEN_SECONDS)
    device.start("a")
    device.start("b")  # the pool puts c, used less recently than a, to sleep for it
    engines = device.engines
    wait_for("c and d asleep", lambda: engines["c"].is_sleeping and engines["d"].is_sleeping)
    assert not any(engines[n].is_sleeping for n in "pab")
    before = slept(device)

    with ThreadPoolExecutor(3) as threads:
        stream = threads.submit(chat, gateway, "p", STREAM_TOKENS)
        wait_for("p busy", lambda: engines["p"].running > 0)
        d_client = threads.submit(gives_up, gateway, "d", 3.0)
        # (The pool may first choose on a view older than p's stream, and find p busy when
        # it comes to put it to sleep: a and b may both sleep then.)
        said = wait_for(
            "d waiting for room while p is busy",
            lambda: (
                (w := cluster.condition("d", "WaitingForRoom"))
                and w["status"] == "True"
                and "busy" in w["message"]
                and w
            ),
        )
        c_answer = chat(gateway, "c")
        assert c_answer.status_code == 200, c_answer.text
        assert not engines["c"].is_sleeping
        assert d_client.result(30) == "gave up"
        assert stream.result(60).status_code == 200
    # What d's wait said is true: p is busy; a and b may sleep but would not free enough.
    assert "1 busy" in said["message"], said
    assert "kept awake" not in said["message"], said
    # p is idle now; d's wake is still asked (its annotation stands) but its client left.
    after_stream = slept(device)
    # A sleep: proves d is not woken for 3 s once its client left.
    time.sleep(3.0)
    assert engines["d"].wake_calls == 0 and engines["d"].is_sleeping
    assert slept(device) == after_stream, "members were put to sleep for a wake nobody waits for"
    # a or b made room for c; p, busy, was never asked to.
    assert engines["p"].sleep_calls == 0
    assert any(after_stream[n] > before[n] for n in "ab")
    waiting = cluster.condition("d", "WaitingForRoom")
    assert waiting is not None and "gone" in waiting["message"], waiting
    assert sum(e.memory.oom_total["wake"] for e in engines.values()) == 0


def test_a_model_s_second_pod_holds_back_no_later_wake(
    cluster: Cluster,
    device: Kubelet,
    gateway: GatewayThread,
    operator_reading: OperatorThread,
) -> None:
    """y (30 GiB) serves a long stream; x's two pods (30 GiB each) and w (8 GiB) sleep. A
    request for x wakes x-0 into the free room; x-1 could only make room with its sibling
    (never) or the busy y. w, asked after, fits in what is left and is served (it got 504
    while x-1's wake stalled the pool)."""
    cluster.create_model("x", member_spec("x", "30Gi"))
    cluster.create_model("w", member_spec("w", "8Gi"))
    cluster.create_model("y", member_spec("y", "30Gi"))
    for name in ("x", "w"):
        cluster.patch_model(name, {"spec": {"desiredState": "Asleep"}})
    device.start("x", pod="x-0")
    device.start("x", pod="x-1")
    device.start("w", gpu_memory_gib=3, kv_cache_gib=4)
    engines = device.engines
    wait_for("x and w asleep", lambda: all(engines[n].is_sleeping for n in ("x", "x-1", "w")))
    for name in ("x", "w"):
        cluster.patch_model(name, {"spec": {"desiredState": "Auto"}})
    device.start("y", token_seconds=TOKEN_SECONDS)

    with ThreadPoolExecutor(2) as threads:
        stream = threads.submit(chat, gateway, "y", STREAM_TOKENS)
        wait_for("y busy", lambda: engines["y"].running > 0)
        x_answer = chat(gateway, "x")
        assert x_answer.status_code == 200, x_answer.text
        woken = [n for n in ("x", "x-1") if not engines[n].is_sleeping]
        assert woken == ["x"], woken
        w_answer = chat(gateway, "w")
        assert w_answer.status_code == 200, w_answer.text
        assert not engines["w"].is_sleeping
        assert stream.result(60).status_code == 200
    assert engines["y"].sleep_calls == 0
    assert engines["x-1"].is_sleeping and engines["x-1"].wake_calls == 0
    assert sum(e.memory.oom_total["wake"] for e in engines.values()) == 0


def test_members_that_start_together_get_their_room_one_at_a_time(
    cluster: Cluster, device: Kubelet, gateway: GatewayThread, sandbox: Sandbox
) -> None:
    """Finding 2: a and b (30 GiB each) are awake and w (8 GiB) sleeps when the operator
    stops; c, d and e (30 GiB each) start meanwhile, and each is refused by the full device.
    The operator that starts then makes room for one member at a time (it waited for room
    for all three at once, which never came: no eviction, every start refused until someone
    deleted a pod), and a request for w, which no starting member could take the room of, is
    answered (504 while the pool waited)."""
    for name in "abcde":
        cluster.create_model(name, member_spec(name, "30Gi"))
    cluster.create_model("w", member_spec("w", "8Gi"))
    engines = device.engines
    first = OperatorThread(FAST).start()
    try:
        cluster.patch_model("w", {"spec": {"desiredState": "Asleep"}})
        device.start("w", gpu_memory_gib=3, kv_cache_gib=4)
        wait_for("w asleep", lambda: engines["w"].is_sleeping)
        cluster.patch_model("w", {"spec": {"desiredState": "Auto"}})
        device.start("a")
        device.start("b")
    finally:
        first.stop()
    for name in "cde":
        device.start(name, wait=False)
    wait_for("c, d and e refused", lambda: all(engines[n].restarts > 0 for n in "cde"))

    second = OperatorThread(FAST).start()
    try:
        # What waits is said: the pool counts the starting members it makes room for, and
        # their models say they wait for room.
        wait_for("the starts counted", lambda: pool_status(cluster).get("waiting", 0) >= 2)
        wait_for(
            "a start's WaitingForRoom",
            lambda: any(
                (w := cluster.condition(n, "WaitingForRoom")) and w["status"] == "True"
                for n in "cde"
            ),
        )
        answer = chat(gateway, "w")
        assert answer.status_code == 200, answer.text
        wait_for("c, d and e loaded", lambda: all(engines[n].loaded for n in "cde"), timeout=60)
    finally:
        second.stop()
    assert sum(e.memory.oom_total["wake"] for e in engines.values()) == 0
