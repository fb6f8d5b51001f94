"""A GPUPool on a real cluster: four models of 30 GiB, each a Deployment of one simulated
engine pod, on one 70 GiB simulated device that the pods share through a hostPath, as pods of
one node share a GPU. At most two fit awake; each request through the gateway is answered,
the pool making room first, and the device is never over-committed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import builders
import pytest
from kube import Kube, wait_for
from prometheus_client.parser import text_string_to_metric_families

from .conftest import ENGINES, image

NAMES = ("p-a", "p-b", "p-c", "p-d")
DEVICE_DIR = "/run/snooze-gpu"


def engine(name: str, host_dir: str, *extra: str) -> dict[str, Any]:
    repository, tag = image()
    labels = {"app.kubernetes.io/name": name, "snooze.dev/engine": "vllm"}
    args = [
        "sim", "--host", "0.0.0.0", "--port", "8000", "--model", name,
        "--shared-gpu-gib", "70", "--shared-gpu-file", f"{DEVICE_DIR}/gpu-0",
        "--gpu-memory-gib", "10", "--kv-cache-gib", "19", "--asleep-memory-gib", "1",
        "--sleep-seconds", "0.3", "--wake-seconds", "0.3", "--start-retry-seconds", "0.3",
        *extra,
    ]  # fmt: skip
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "automountServiceAccountToken": False,
                    "containers": [
                        {
                            "name": "vllm",
                            "image": f"{repository}:{tag}",
                            "args": args,
                            "ports": [{"name": "http", "containerPort": 8000}],
                            "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}},
                            "volumeMounts": [{"name": "gpu", "mountPath": DEVICE_DIR}],
                        }
                    ],
                    # The simulated device's books, shared by the pods of the node.
                    "volumes": [
                        {"name": "gpu", "hostPath": {"path": host_dir, "type": "DirectoryOrCreate"}}
                    ],
                },
            },
        },
    }


def model(name: str, **spec: Any) -> dict[str, Any]:
    """A member of gpu-0 (30Gi awake, 1Gi asleep), asleep only when the pool needs the room."""
    member = {
        "idle": {"after": "Never"},
        "pool": {"name": "gpu-0", "memory": "30Gi", "asleepMemory": "1Gi"},
        "wake": {"timeout": "60s"},
    }
    return builders.model(name, match_labels={"app.kubernetes.io/name": name}, **member | spec)


POOL = builders.gpu_pool(minResidency="1s")


def device_dir(kube: Kube) -> str:
    """The hostPath that holds the simulated device's books."""
    return str(kube.local.workdir / "gpu") if kube.local else "/tmp/snooze-test-gpu"


@pytest.fixture
def members(kube: Kube, release: str) -> Iterator[None]:
    host_dir = device_dir(kube)
    kube.apply([POOL, *[model(n) for n in NAMES], *[engine(n, host_dir) for n in NAMES]],
               "-n", ENGINES)  # fmt: skip
    try:
        yield
    finally:
        remove_all(kube, host_dir)


def remove_all(kube: Kube, host_dir: str) -> None:
    """The pool, its members' Deployments and models, their pods, and the device's books."""
    objects = ["gpupool/gpu-0"] + [f"{kind}/{n}" for kind in ("deployment", "im") for n in NAMES]
    kube.delete_and_wait(ENGINES, f"app.kubernetes.io/name in ({','.join(NAMES)})", *objects)
    if kube.local:
        Path(host_dir, "gpu-0").unlink(missing_ok=True)


def phases(kube: Kube) -> dict[str, str]:
    return {n: kube.get("im", n, ENGINES).get("status", {}).get("phase", "") for n in NAMES}


def oom(kube: Kube) -> dict[str, float]:
    """Each engine's refused allocations, by operation, from its own metrics."""
    counts: dict[str, float] = {}
    with kube.http() as http:
        for name in NAMES:
            for pod in kube.ready_pods(ENGINES, f"app.kubernetes.io/name={name}"):
                page = http.get(kube.url(pod, 8000, "/metrics")).text
                for family in text_string_to_metric_families(page):
                    for sample in family.samples:
                        if sample.name == "snooze_sim_gpu_oom_total":
                            key = sample.labels.get("operation", "")
                            counts[key] = counts.get(key, 0) + sample.value
    return counts


def test_four_members_share_one_device_two_at_a_time(
    kube: Kube, members: None, gateway_pod: Any
) -> None:
    wait_for(
        "every member settled, two awake",
        lambda: sorted(phases(kube).values()) == ["Asleep", "Asleep", "Awake", "Awake"],
        timeout=180,
    )
    url = kube.url(gateway_pod, 8080, "/v1/completions")
    with kube.http(timeout=120) as http:
        for name in (*NAMES, *reversed(NAMES)):
            answer = http.post(url, json={"model": name, "prompt": "hi", "max_tokens": 3})
            assert answer.status_code == 200, f"{name}: {answer.status_code} {answer.text}"
            assert list(phases(kube).values()).count("Awake") <= 2
    assert oom(kube).get("wake", 0) == 0, "a wake ran out of memory: the pool over-committed"
    pool = kube.get("gpupool", "gpu-0", ENGINES)["status"]
    assert pool["evictions"] >= 4, pool


def test_a_member_whose_sleep_keeps_its_memory_is_restarted_and_the_neighbour_served(
    kube: Kube, release: str, gateway_pod: Any
) -> None:
    """p-a answers /sleep but keeps its 30 GiB (the simulator's --sleep-frees-nothing). A
    request for p-c puts p-a to sleep (the lower priority); p-c's wake runs out of memory; the
    pool blames p-a and, as its model's wake.onFailure says (Restart, the default), deletes its
    pod: on a real node that ends its engine and frees its memory, its Deployment makes a new
    pod, and p-c is served."""
    a, b, c = NAMES[:3]
    host_dir = device_dir(kube)
    # p-b outranks p-a, so p-a is the one put to sleep for p-c. (Least recently used alone
    # races: the operator learns of p-b's request at its next probe, and until then p-b may
    # look as unused as p-a, and truly free its memory.)
    kept = {"pool": {**model(b)["spec"]["pool"], "priority": 10}}
    kube.apply([POOL, model(a), model(b, **kept), model(c, desiredState="Asleep"),
                engine(c, host_dir)], "-n", ENGINES)  # fmt: skip
    try:
        wait_for("p-c asleep", lambda: phases(kube).get(c) == "Asleep", timeout=120)
        kube.kubectl("patch", "im", c, "-n", ENGINES, "--type=merge",
                     "-p", '{"spec": {"desiredState": "Auto"}}')  # fmt: skip
        kube.apply([engine(a, host_dir, "--sleep-frees-nothing"), engine(b, host_dir)],
                   "-n", ENGINES)  # fmt: skip
        wait_for("p-a and p-b awake", lambda: phases(kube).get(a) == phases(kube).get(b)
                 == "Awake", timeout=120)  # fmt: skip
        liar = kube.ready_pods(ENGINES, f"app.kubernetes.io/name={a}")[0].metadata.name
        url = kube.url(gateway_pod, 8080, "/v1/completions")
        with kube.http(timeout=180) as http:
            ask = {"prompt": "hi", "max_tokens": 3}
            assert http.post(url, json={**ask, "model": b}).status_code == 200
            answer = http.post(url, json={**ask, "model": c})
        assert answer.status_code == 200, answer.text

        def told() -> list[str]:
            events = kube.kubectl("get", "events", "-n", ENGINES, "-o", "json").stdout
            items = json.loads(events)["items"]
            return [e["message"] for e in items if e["reason"] == "MemoryNotFreed"]

        # The operator writes its Events from a queue, after every other write: waited for.
        blamed = f"{liar} ({a}) said it slept"
        wait_for(blamed, lambda: any(m.startswith(blamed) for m in told()), timeout=60)
        # Its pod was deleted and its Deployment made another.
        wait_for("p-a's pod replaced", lambda: [
            p.metadata.name for p in kube.ready_pods(ENGINES, f"app.kubernetes.io/name={a}")
        ] not in ([], [liar]), timeout=120)  # fmt: skip
    finally:
        remove_all(kube, host_dir)
