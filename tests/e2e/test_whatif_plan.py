"""`snooze whatif plan` as the README and docs/whatif.md print it, on the ServeGen trace: the
plan, its replay from the manifests it wrote, and those manifests applied with the real kubectl
to the sandbox; then they run there: each model's pod on a simulated engine of its footprint,
each pool's on one simulated device of the plan's memory, and the real operator keeping every
pool within its device while members start and wake."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import whatif_pages as pages
import yaml
from waits import wait_for

from snooze.operator.embedded import OperatorThread
from snooze.sandbox import Sandbox
from snooze.sim import EngineConfig, SimulatedEngine, SimulatorHost

from .conftest import FAST, Cluster, _addresses
from .test_pools import Watcher

pytestmark = pytest.mark.needs("kubectl", "bash")

GIB = 2**30
DEVICE_GIB = 80
WEIGHTS_GIB = 16.0
ASLEEP_GIB = 1.5  # what a simulated engine keeps asleep: under the plan's 2Gi asleepMemory
AWAKE_GIB = 36.0


@pytest.fixture
def kube(sandbox: Sandbox, tmp_path: Path) -> Iterator[dict[str, str]]:
    """kubectl's environment for the sandbox (whose CRDs are applied, as by `kubectl apply -f
    crds/`)."""
    yield {"KUBECONFIG": os.environ["KUBECONFIG"], "KUBECACHEDIR": str(tmp_path / "cache")}


def figures(plan: dict[str, Any]) -> None:
    """The plan's figures as the README and the docs print them."""
    result = plan["result"]
    devices = plan["devices"]
    readme_row = pages.readme_row(
        f"the plan's {devices} GPUPools, every model's p99 within {plan['target_p99_s']:g} s",
        result,
    )
    assert readme_row in pages.readme_section()
    assert readme_row in pages.docs()  # its headline table
    docs = " ".join(pages.docs().split())  # a sentence may run over lines
    assert pages.docs_row(f"the plan ({devices} pools)", result) in docs
    for pool in plan["pools"]:
        row = (
            f"| `{pool['name']}` | {', '.join(pool['models'])} | "
            f"{pool['held']} of {pool['requests']:,} | {pages.seconds(pool['p99_s'])} |"
        )
        assert row in docs
    assert (
        f"{result['device_hours_held']:,.0f} device-hours ({devices} devices, the peak too), "
        f"{result['held_requests']} requests held, "
        f"{result['added_latency_p99_s']:.2f} s at the p99 of those, {result['swaps']} swaps"
    ) in docs
    assert f"It finds {devices} devices in about" in docs
    assert f"({plan['replays']} pools replayed)" in docs


def start(cluster: Cluster, doc: dict[str, Any], device: str) -> SimulatedEngine:
    """The model's pod, labelled as its InferenceModel selects, on an engine of the plan's
    footprint on the pool's device; Ready once its engine has loaded (it waits for room, as
    vLLM does, while the pool makes it)."""
    name = doc["metadata"]["name"]
    host = next(_addresses)
    config = EngineConfig(
        model=doc["spec"]["modelName"],
        host=host,
        port=8000,
        device=device,
        gpu_memory_gib=WEIGHTS_GIB,
        kv_cache_gib=AWAKE_GIB - WEIGHTS_GIB - ASLEEP_GIB,
        asleep_memory_gib=ASLEEP_GIB,
        sleep_seconds=0.1,
        wake_seconds=0.1,
        token_seconds=0.01,
        start_retry_seconds=0.1,
    )
    labels = doc["spec"]["selector"]["matchLabels"]
    engine = cluster.create_pod(f"{name}-0", labels=labels, engine=config, ready=False)
    wait_for(f"{name} loaded", lambda: engine.loaded, timeout=60)
    cluster.set_pod_ready(f"{name}-0", host, ready=True)
    return engine


def test_the_plan_applies_to_the_sandbox_and_runs_there(
    tmp_path: Path, kube: dict[str, str], cluster: Cluster, sim: SimulatorHost
) -> None:
    done = pages.bash(pages.PLAN_BLOCK, tmp_path, env=kube)
    [plan] = pages.json_lines(done.stdout, "plan")
    [replayed] = pages.json_lines(done.stdout, "policies")
    # The manifests, replayed as a user's own (`declared`), give the plan's own figures.
    assert replayed == [{**plan["result"], "name": "declared"}]
    figures(plan)
    # Every pool and model applied, none refused by the CRDs' schemas.
    applied = done.stdout
    for pool in plan["pools"]:
        assert f"gpupool.snooze.dev/{pool['name']} created" in applied
    assert applied.count("inferencemodel.snooze.dev/") == plan["models"]
    # The README's command makes the same plan.
    [again] = pages.json_lines(pages.bash(pages.PLAN, tmp_path).stdout, "plan")
    assert {k: v for k, v in again.items() if k != "search_seconds"} == {
        k: v for k, v in plan.items() if k != "search_seconds"
    }

    out = Path(done.stdout.split("manifest files to ")[1].split()[0])
    pools = {
        path.stem: list(yaml.safe_load_all(path.read_text())) for path in sorted(out.glob("*.yaml"))
    }
    devices = {name: sim.add_device(name=name, memory_gib=DEVICE_GIB) for name in pools}
    operator = OperatorThread(FAST).start()
    watchers = []
    try:
        engines: dict[str, dict[str, SimulatedEngine]] = {name: {} for name in pools}
        watchers += [Watcher(engines[name]) for name in pools]

        def start_pool(name: str) -> None:
            """The pool's members one after another (the pools side by side)."""
            gpupool, *models = pools[name]
            assert gpupool["kind"] == "GPUPool" and gpupool["spec"]["memory"] == "80Gi"
            for doc in models:
                engines[name][doc["metadata"]["name"]] = start(cluster, doc, name)

        with ThreadPoolExecutor(len(pools)) as threads:
            list(threads.map(start_pool, pools))
        for name, members in engines.items():
            wait_for(
                f"{name}'s members seen",
                lambda n=name, m=members: pool_members(cluster, n) == set(m),
                timeout=60,
            )
        # A wake asked for a sleeping member of each pool: granted, another makes room.
        for members in engines.values():
            asleep = sorted(m for m, e in members.items() if e.is_sleeping)
            if not asleep:
                continue
            cluster.request_wake(asleep[0])
            wait_for(
                f"{asleep[0]} awake", lambda e=members[asleep[0]]: not e.is_sleeping, timeout=60
            )
        assert cluster.events("MakingRoom")
        # A sleep: proves the bounds hold for a second more (the watchers keep sampling).
        time.sleep(1.0)
        for name, watcher in zip(engines, watchers, strict=True):
            # Two of 36 GiB fit in 80 beside the others' residues: never three at once.
            assert watcher.most_awake <= 2, name
            # No wake ran out of memory (an engine that starts before the pool has made its
            # room is refused and retries, as vLLM's container would).
            assert sum(e.memory.oom_total["wake"] for e in engines[name].values()) == 0
            assert devices[name].used_bytes <= DEVICE_GIB * GIB
            status = pool_status(cluster, name)
            assert status["memoryBytes"] == DEVICE_GIB * GIB
            assert all(m["footprintBytes"] == AWAKE_GIB * GIB for m in status["members"])
    finally:
        for watcher in watchers:
            watcher.stop()
        operator.stop()


def pool_status(cluster: Cluster, name: str) -> dict[str, Any]:
    body = cluster.http.get(f"/apis/snooze.dev/v1alpha1/namespaces/default/gpupools/{name}")
    status: dict[str, Any] = body.json().get("status") or {}
    return status


def pool_members(cluster: Cluster, name: str) -> set[str]:
    members = pool_status(cluster, name).get("members") or []
    return {m["model"] for m in members if m.get("state") in ("awake", "asleep")}
