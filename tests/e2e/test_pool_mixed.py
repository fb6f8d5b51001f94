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
from .test_pools import Kubelet, Watcher, ask, device_and_pool, start_refusals, wake_ooms

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
