"""A GPU pool whose members run different engines: two vLLM engines and two SGLang servers of
30 GiB on one simulated 70 GiB device, at most two awake, under the pool tests' traffic (a
request for each sleeping model through the gateway); the device is never over-committed and
no SGLang server is killed by what the operator sent it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from gateway_fixtures import GatewayThread
from waits import wait_for

from snooze.sim.sglang.engine import SGLangConfig, SGLangEngine

from .conftest import Cluster, OperatorThread
from .test_pools import (
    GIB,
    Kubelet,
    Watcher,
    ask,
    device_and_pool,
    patch_pool,
    pool_status,
    start_refusals,
    wake_ooms,
)

ENGINES = {"a": "vllm", "b": "sglang", "c": "vllm", "d": "sglang"}
SGLANG_TIMES = {"level2_sleep_seconds": 0.05, "reload_seconds": 0.2}


@pytest.fixture
def mixed(cluster: Cluster) -> Iterator[Kubelet]:
    kubelet = device_and_pool(cluster)
    for name, kind in ENGINES.items():
        cluster.create_model(
            name,
            {
                "selector": {"matchLabels": {"app": name}},
                "engine": {"kind": kind},
                "idle": {"after": "Never"},  # asleep only when the pool needs the room
                "pool": {"name": "gpu-0", "memory": "30Gi", "asleepMemory": "1Gi"},
                "wake": {"timeout": "30s"},
            },
        )
    yield kubelet


def test_vllm_and_sglang_members_share_a_gpu_two_at_a_time(
    cluster: Cluster, mixed: Kubelet, operator: OperatorThread, gateway: GatewayThread
) -> None:
    watcher = Watcher(mixed.engines)
    try:
        for name, kind in ENGINES.items():  # each starts once the pool has made room for it
            if kind == "sglang":
                mixed.start(name, kind=SGLangConfig, **SGLANG_TIMES)
            else:
                mixed.start(name)
        wait_for("two asleep", lambda: sum(e.is_sleeping for e in mixed.engines.values()) == 2)
        assert start_refusals(mixed) == 0
        # A request for each sleeping model, then for each again: answered every time, after an
        # idle member (of either engine) makes room.
        for _ in range(2):
            for name in [n for n, e in mixed.engines.items() if e.is_sleeping]:
                assert ask(gateway, name) == "lorem ipsum"
                assert not mixed.engines[name].is_sleeping
        assert wake_ooms(mixed) == 0
        assert watcher.most_awake <= 2
    finally:
        watcher.stop()
    sglang = [e for e in mixed.engines.values() if isinstance(e, SGLangEngine)]
    assert len(sglang) == 2
    for engine in sglang:
        assert engine.death is None and not engine.dead  # never killed by a call
        assert engine.calls.get("release_memory_occupation", 0) >= 1
    assert operator.metrics.pool_oom.labels("default", "gpu-0")._value.get() == 0


def test_sglang_servers_that_keep_a_host_copy_are_counted_in_the_pools_host_memory(
    cluster: Cluster, operator: OperatorThread, gateway: GatewayThread
) -> None:
    """Two SGLang servers with --enable-weights-cpu-backup sleep at level 1 whatever the pool
    asks (their level is their flag), each pinning its 10 GiB of weights in host RAM; the
    pool's hostMemory holds one copy. Beside them a vLLM engine, which can sleep at level 2.
    Requests for each sleeping model in turn: the servers never pin more than hostMemory
    together, and the pool's status counts what each engine holds."""
    kubelet = device_and_pool(cluster)
    patch_pool(cluster, {"hostMemory": "10Gi"})
    for name, kind in (("a", "vllm"), ("b", "sglang"), ("d", "sglang")):
        cluster.create_model(
            name,
            {
                "selector": {"matchLabels": {"app": name}},
                "engine": {"kind": kind},
                "idle": {"after": "Never"},
                "sleep": {"level": 1},
                "pool": {
                    "name": "gpu-0",
                    "memory": "30Gi",
                    "asleepMemory": "1Gi",
                    "weightsMemory": "10Gi",
                },
                "wake": {"timeout": "30s"},
            },
        )
    watcher = Watcher(kubelet.engines)
    try:
        kubelet.start("a")
        for name in ("b", "d"):  # the third starts once one of the first two slept
            kubelet.start(name, kind=SGLangConfig, weights_cpu_backup=True, **SGLANG_TIMES)
        wait_for("one asleep", lambda: sum(e.is_sleeping for e in kubelet.engines.values()) == 1)
        for _ in range(3):
            [name] = [n for n, e in kubelet.engines.items() if e.is_sleeping]
            assert ask(gateway, name) == "lorem ipsum"
            assert not kubelet.engines[name].is_sleeping
    finally:
        watcher.stop()
    assert watcher.most_pinned <= 10 * GIB, watcher.most_pinned / GIB
    assert wake_ooms(kubelet) == 0
    servers = [e for e in kubelet.engines.values() if isinstance(e, SGLangEngine)]
    assert all(e.death is None and not e.dead for e in servers)
    # The one server that slept kept its copy; the other was never put to sleep, as its copy
    # could not be held beside it.
    assert sorted(e.host_memory_bytes for e in servers) == [0, 10 * GIB]
    # The vLLM engine made room every other time, at level 2 (hostMemory was full).
    vllm = kubelet.engines["a"]
    assert vllm.host_memory_bytes == 0 and vllm.sleep_calls >= 1

    def counted() -> bool:
        members = {m["pod"][:-2]: m.get("hostBytes", 0) for m in pool_status(cluster)["members"]}
        return members == {n: e.host_memory_bytes for n, e in kubelet.engines.items()}

    wait_for("the pool's status counting each copy", counted)
