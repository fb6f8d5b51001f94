"""docs/pools.md, as a person runs it: its commands, exactly as printed,
through bash and the real kubectl against the sandbox, with examples/pools/ applied as they are,
their Deployments' pods stood up as a kubelet would (each on a simulated engine sharing one
79 GiB device, sized by the pod's own --gpu-memory-utilization), and the real operator."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docs_pages
import httpx
import pytest
import yaml
from waits import wait_for

from snooze.operator.embedded import OperatorThread
from snooze.sandbox import Sandbox
from snooze.sim import EngineConfig, SimulatedEngine, SimulatorHost

from .conftest import FAST, _addresses
from .test_pools import Watcher

pytestmark = pytest.mark.needs("kubectl")

ROOT = Path(__file__).resolve().parents[2]
PAGE = "docs/pools.md"
PODS = "/api/v1/namespaces/default/pods"
GIB = 2**30
DEVICE_GIB = 79  # the examples' GPUPool memory: the simulated GPU is exactly that big
ASLEEP_GIB = 1.5  # what a simulated engine keeps asleep: under the examples' asleepMemory
CONTAINER_START_SECONDS = 1.0  # image, Python, CUDA: before vLLM looks at the free memory

# The page's commands, each run below exactly as printed (test_the_page_prints_these_commands
# keeps the two lists equal).
APPLY_CRDS = "kubectl apply -f crds/"
APPLY_DRA = "kubectl apply -f examples/pools/dra/"
LABEL_NODE = "kubectl label node gpu-node-1 nvidia.com/device-plugin.config=time-sliced-4"
APPLY_TIME_SLICING = "kubectl apply -f examples/pools/time-slicing/"
GET_POOLS = "kubectl get gpool"
GET_USED = (
    "kubectl get gpool shared-h100 -o jsonpath='{.status.used} used, {.status.waiting} waiting:"
    ' {.status.waitingModels}{"\\n"}\''
)
GET_WAITING = (
    "kubectl get im -o custom-columns='MODEL:.metadata.name,PHASE:.status.phase,WAITING FOR"
    ' ROOM:.status.conditions[?(@.type=="WaitingForRoom")].message\''
)
WAKE_CODER = (
    "kubectl annotate im qwen2-5-coder-7b"
    " snooze.dev/wake-requested-at=$(date -u +%Y-%m-%dT%H:%M:%SZ) --overwrite"
)
GET_MAKING_ROOM = "kubectl get events --field-selector reason=MakingRoom"
COMMANDS = [
    APPLY_CRDS,
    APPLY_DRA,
    LABEL_NODE,
    APPLY_CRDS,
    APPLY_TIME_SLICING,
    GET_POOLS,
    GET_USED,
    GET_WAITING,
    WAKE_CODER,
    GET_MAKING_ROOM,
]


def page_commands() -> list[str]:
    """Every line of the page's command blocks, in order."""
    return docs_pages.commands(docs_pages.read(PAGE))


def test_the_page_prints_these_commands() -> None:
    assert page_commands() == COMMANDS


class Node:
    """The sandbox as a cluster with GPUs: kubectl in bash, and a stand-in for the Deployment
    controller and the kubelet that starts each pod's engine on the one shared GPU."""

    def __init__(self, sandbox: Sandbox, sim: SimulatorHost, tmp: Path) -> None:
        self.sandbox = sandbox
        self.sim = sim
        self.http = httpx.Client(base_url=sandbox.url, timeout=10)
        self.env = {
            **os.environ,
            "KUBECONFIG": str(sandbox.write_kubeconfig(tmp / "kubeconfig")),
            "KUBECACHEDIR": str(tmp / "cache"),
        }
        self.device = sim.add_device(name="gpu", memory_gib=DEVICE_GIB)
        self.engines: dict[str, SimulatedEngine] = {}

    def run(self, command: str) -> subprocess.CompletedProcess[str]:
        assert command in COMMANDS, command
        return subprocess.run(
            ["bash", "-c", command], env=self.env, cwd=ROOT, capture_output=True, text=True,
            timeout=60,
        )  # fmt: skip

    def ok(self, command: str) -> str:
        result = self.run(command)
        assert result.returncode == 0, f"{command}: {result.stderr}"
        return result.stdout

    def start(self, deployment: str) -> None:
        """One pod of the Deployment, made from its template as the controller would; its
        engine starts once the container is up and loads when the device has its share free,
        and the pod turns Ready once it has."""
        body = self.http.get(f"/apis/apps/v1/namespaces/default/deployments/{deployment}")
        template = body.raise_for_status().json()["spec"]["template"]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {**template["metadata"], "name": f"{deployment}-0"},
            "spec": template["spec"],
        }
        self.http.post(PODS, json=pod).raise_for_status()
        host = next(_addresses)
        self.set_ready(f"{deployment}-0", host, ready=False)
        time.sleep(CONTAINER_START_SECONDS)
        [container] = template["spec"]["containers"]
        args = container["args"]
        share = float(args[args.index("--gpu-memory-utilization") + 1])
        weights = 16.0
        config = EngineConfig(
            model=args[0],
            host=host,
            port=8000,
            device=self.device.name,
            gpu_memory_gib=weights,
            kv_cache_gib=share * DEVICE_GIB - weights - ASLEEP_GIB,
            asleep_memory_gib=ASLEEP_GIB,
            sleep_seconds=0.2,
            wake_seconds=0.2,
            token_seconds=0.01,
            start_retry_seconds=0.2,
            checksum_seconds_per_gib=0.001,
        )
        engine = self.sim.add(config)
        self.engines[deployment] = engine
        wait_for(f"{deployment} loaded", lambda: engine.loaded, timeout=30)
        self.set_ready(f"{deployment}-0", host, ready=True)

    def set_ready(self, name: str, ip: str, *, ready: bool) -> None:
        status = {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        }
        self.http.patch(
            f"{PODS}/{name}/status",
            json={"status": status},
            headers={"Content-Type": "application/merge-patch+json"},
        ).raise_for_status()

    def patch(self, path: str, patch: dict[str, Any]) -> None:
        self.http.patch(
            path, json=patch, headers={"Content-Type": "application/merge-patch+json"}
        ).raise_for_status()

    def pool(self, name: str) -> dict[str, Any]:
        body = self.http.get(f"/apis/snooze.dev/v1alpha1/namespaces/default/gpupools/{name}")
        status: dict[str, Any] = body.raise_for_status().json().get("status") or {}
        return status

    def awake(self) -> set[str]:
        return {n for n, e in self.engines.items() if e.loaded and not e.is_sleeping}

    def settled(self, pool: str, awake: set[str]) -> bool:
        """These engines awake, the others asleep, and the pool seeing it so."""
        status = self.pool(pool)
        members = status.get("members") or []
        return (
            self.awake() == awake
            and len(members) == len(self.engines)
            and all(m["state"] in ("awake", "asleep") for m in members)
            and {m["model"] for m in members if m["state"] == "awake"} == awake
        )

    def wake_ooms(self) -> int:
        return sum(e.memory.oom_total["wake"] for e in self.engines.values())


@pytest.fixture
def node(tmp_path: Path, sim: SimulatorHost) -> Iterator[Node]:
    with Sandbox() as sandbox:
        n = Node(sandbox, sim, tmp_path)
        yield n
        n.http.close()


def start_operator(node: Node, monkeypatch: pytest.MonkeyPatch) -> OperatorThread:
    monkeypatch.setenv("KUBECONFIG", node.env["KUBECONFIG"])
    return OperatorThread(FAST).start()


def start_in_turn(node: Node, pool: str) -> None:
    """The four Deployments' pods, one after another, each once the last has settled: with
    priorities, who makes room for whom is then the same every run."""
    expected = [
        ("deepseek-r1-distill-llama-8b", {"deepseek-r1-distill-llama-8b"}),
        ("qwen2-5-coder-7b", {"deepseek-r1-distill-llama-8b", "qwen2-5-coder-7b"}),
        # qwen3-8b needs room: the coder (priority -10) makes it.
        ("qwen3-8b", {"deepseek-r1-distill-llama-8b", "qwen3-8b"}),
        # granite needs room: deepseek (0) makes it, not qwen3 (10).
        ("granite-3-3-8b", {"qwen3-8b", "granite-3-3-8b"}),
    ]
    for deployment, awake in expected:
        node.start(deployment)
        wait_for(f"{sorted(awake)} awake", lambda a=awake: node.settled(pool, a), timeout=30)


def test_the_dra_example_as_the_page_runs_it(node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    assert "created" in node.ok(APPLY_CRDS)
    applied = node.run(APPLY_DRA)
    # The sandbox serves no resource.k8s.io: kubectl applies everything else and names the
    # claim (tests/unit/test_examples_pools.py validates it for Kubernetes 1.34).
    assert applied.returncode == 1
    assert applied.stderr.strip().splitlines() == [
        'error: resource mapping not found for name: "shared-h100" namespace: "" from'
        ' "examples/pools/dra/claim.yaml": no matches for kind "ResourceClaim" in version'
        ' "resource.k8s.io/v1"',
        "ensure CRDs are installed first",
    ]
    created = sorted(applied.stdout.split())
    assert created.count("created") == 9 and "gpupool.snooze.dev/shared-h100" in created
    # The example keeps a woken member a minute; a test need not wait it.
    gpupools = "/apis/snooze.dev/v1alpha1/namespaces/default/gpupools"
    node.patch(f"{gpupools}/shared-h100", {"spec": {"minResidency": "10ms"}})
    operator = start_operator(node, monkeypatch)
    watcher = Watcher(node.engines)
    try:
        start_in_turn(node, "shared-h100")
        status = node.pool("shared-h100")
        # Members by the claim their pods reference; footprints from spec.pool.memory.
        assert {m["model"]: m["footprintBytes"] for m in status["members"]} == {
            "qwen3-8b": 36 * GIB,
            "granite-3-3-8b": 36 * GIB,
            "deepseek-r1-distill-llama-8b": 36 * GIB,
            "qwen2-5-coder-7b": 32 * GIB,
        }
        header, row = node.ok(GET_POOLS).splitlines()
        assert header.split() == ["NAME", "MEMORY", "USED", "AWAKE", "WAITING", "EVICTIONS", "AGE"]
        assert row.split()[:6] == ["shared-h100", "79Gi", "76GiB/79GiB", "2", "0", "2"]

        # Both awake models kept awake by hand: the coder's wake waits, and says why.
        models = "/apis/snooze.dev/v1alpha1/namespaces/default/inferencemodels"
        for name in ("qwen3-8b", "granite-3-3-8b"):
            node.patch(f"{models}/{name}", {"spec": {"desiredState": "Awake"}})
        assert "annotated" in node.ok(WAKE_CODER)
        wait_for("the wake waiting", lambda: node.pool("shared-h100").get("waiting") == 1)
        assert node.ok(GET_USED) == '76GiB/79GiB used, 1 waiting: ["qwen2-5-coder-7b"]\n'
        message = (
            "waiting for 30GiB on GPUPool shared-h100: no awake member can make room:"
            " 2 kept awake by their models (minAwake, desiredState)"
        )
        wait_for("WaitingForRoom", lambda: message in node.ok(GET_WAITING))
        rows = {line.split()[0]: line for line in node.ok(GET_WAITING).splitlines()[1:]}
        assert rows["qwen2-5-coder-7b"].split()[1] == "Asleep"
        assert all(message not in rows[m] for m in rows if m != "qwen2-5-coder-7b")
        assert node.awake() == {"qwen3-8b", "granite-3-3-8b"}

        # granite back to Auto: it makes room (priority 0, under qwen3's 10), the coder wakes.
        node.patch(f"{models}/granite-3-3-8b", {"spec": {"desiredState": "Auto"}})
        wait_for(
            "the coder awake",
            lambda: node.settled("shared-h100", {"qwen3-8b", "qwen2-5-coder-7b"}),
            timeout=30,
        )
        events = node.ok(GET_MAKING_ROOM)
        assert "granite-3-3-8b-0 (granite-3-3-8b) sleeps to make room for qwen2-5-coder-7b" in (
            events
        )
        assert "MakingRoom" in events
        after = node.ok(GET_WAITING).splitlines()[1:]
        assert len(after) == 4
        assert all(line.endswith("no wake waits for room on a GPU pool") for line in after)
        assert watcher.most_awake <= 2
        assert node.wake_ooms() == 0 and node.device.oom_total == 0
        assert operator.metrics.pool_oom.labels("default", "shared-h100")._value.get() == 0
    finally:
        watcher.stop()
        operator.stop()


def test_the_time_slicing_example_as_the_page_runs_it(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    node.http.post(
        "/api/v1/nodes",
        json={"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-node-1"}},
    ).raise_for_status()
    assert node.ok(LABEL_NODE) == "node/gpu-node-1 labeled\n"
    node.ok(APPLY_CRDS)
    out = node.ok(APPLY_TIME_SLICING)
    assert "configmap/nvidia-plugin-configs created" in out and out.count("created") == 11
    config = node.http.get(
        "/api/v1/namespaces/nvidia-device-plugin/configmaps/nvidia-plugin-configs"
    ).json()
    sliced = yaml.safe_load(config["data"]["time-sliced-4"])
    assert sliced["sharing"]["timeSlicing"]["resources"] == [
        {"name": "nvidia.com/gpu", "replicas": 4}
    ]
    node_labels = node.http.get("/api/v1/nodes/gpu-node-1").json()["metadata"]["labels"]
    gpupools = "/apis/snooze.dev/v1alpha1/namespaces/default/gpupools"
    node.patch(f"{gpupools}/gpu-node-1", {"spec": {"minResidency": "10ms"}})
    operator = start_operator(node, monkeypatch)
    watcher = Watcher(node.engines)
    try:
        for deployment in ("qwen3-8b", "granite-3-3-8b"):
            template = node.http.get(
                f"/apis/apps/v1/namespaces/default/deployments/{deployment}"
            ).json()["spec"]["template"]
            # Scheduled to the labelled node, as its nodeSelector asks.
            assert (
                template["spec"]["nodeSelector"].items()
                <= {
                    "kubernetes.io/hostname": "gpu-node-1",
                    **node_labels,
                }.items()
            )
        start_in_turn(node, "gpu-node-1")
        status = node.pool("gpu-node-1")
        # Members by their snooze.dev/pool label; footprints from the engines' own shares.
        footprints = {m["model"]: m["footprintBytes"] / GIB for m in status["members"]}
        assert footprints == pytest.approx(
            {
                "qwen3-8b": 0.45 * DEVICE_GIB,
                "granite-3-3-8b": 0.45 * DEVICE_GIB,
                "deepseek-r1-distill-llama-8b": 0.45 * DEVICE_GIB,
                "qwen2-5-coder-7b": 0.40 * DEVICE_GIB,
            }
        )
        _, row = node.ok(GET_POOLS).splitlines()
        assert row.split()[:6] == ["gpu-node-1", "79Gi", "75.1GiB/79GiB", "2", "0", "2"]
        assert watcher.most_awake <= 2
        assert node.wake_ooms() == 0 and node.device.oom_total == 0
    finally:
        watcher.stop()
        operator.stop()
