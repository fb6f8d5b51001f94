"""`snooze check` on a cluster, as a user runs it after the install page's install: the real
process against the sandbox holding the release's objects, with the real operator writing the
models' status (in a thread, or as peered `snooze operator` processes for the leader), and a
simulated engine per pod; asserting on its lines and its exit status."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from check_install import (
    ENGINE_POD,
    OPERATOR_POD,
    add_engine_pod,
    apply_model,
    apply_release,
    example,
    installed,
    model_running,
    start_operator_pods,
)
from check_runs import Run, check
from ports import free_port
from waits import wait_for

from snooze.api import rbac
from snooze.operator.embedded import OperatorThread
from snooze.sandbox import Sandbox

from .conftest import Cluster, next_address

pytestmark = pytest.mark.needs("kubectl")
__all__ = ["installed", "model_running"]  # fixtures


@pytest.mark.usefixtures("model_running")
def test_a_healthy_install_checks_ok(cluster: Cluster) -> None:
    run = check()
    assert run.code == 0, run.out + run.err
    assert run.lines() == {
        ("Cluster", "api"): "ok",
        ("Cluster", "crds"): "ok",
        ("Operator snooze/snooze-operator", "operator"): "ok",
        ("Operator snooze/snooze-operator", "leader"): "ok",
        ("Operator snooze/snooze-operator", "permissions"): "ok",
        ("InferenceModel default/qwen3-8b", "model"): "ok",
        ("InferenceModel default/qwen3-8b", "pods"): "ok",
        ("InferenceModel default/qwen3-8b", "engines"): "ok",
    }
    assert f"standalone: pod {OPERATOR_POD} acts" in run.line("leader")
    needed = sum(len(p.verbs) for p in (*rbac.OPERATOR, *rbac.GATEWAY_DISCOVERY))
    assert f"snooze:snooze-operator may do all {needed} things" in run.line("permissions")
    document = check("--output", "json").document()
    assert document["passed"] is True and document["counts"] == {
        "ok": 8,
        "warning": 0,
        "failure": 0,
    }


@pytest.mark.usefixtures("model_running")
def test_impersonation_refused_is_a_warning_that_says_what_to_run(cluster: Cluster) -> None:
    cluster.sandbox.inject_fault(
        method="POST",
        path_contains="selfsubjectaccessreviews",
        status=403,
        times=1000,
        message='users "system:serviceaccount:snooze:snooze-operator" is forbidden: User '
        '"alice" cannot impersonate resource "users" in API group "" at the cluster scope',
    )
    run = check()
    assert run.code == 0, run.out
    line = run.line("permissions")
    assert line.startswith("  warning") and "cannot impersonate" in line
    assert "kubectl auth can-i --list --as=system:serviceaccount:snooze:snooze-operator" in line


def test_an_unreachable_engine_and_a_missing_crd_fail(
    cluster: Cluster, installed: dict[str, Any], operator: OperatorThread
) -> None:
    # A pod whose address no engine listens at: the operator says it cannot reach it.
    [deployment] = [d for d in example("vllm-qwen3-8b.yaml") if d["kind"] == "Deployment"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    cluster.add_pod(ENGINE_POD, labels=labels, ip=next_address())
    apply_model(cluster)
    wait_for(
        "the engine unreachable",
        lambda: (
            [p.get("state") for p in cluster.status("qwen3-8b").get("pods") or []]
            == ["unreachable"]
        ),
        timeout=30,
    )
    crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    assert httpx.delete(f"{cluster.sandbox.url}{crds}/gpupools.snooze.dev").status_code == 200
    run = check()
    assert run.code == 1
    lines = run.lines()
    assert lines[("Cluster", "crds")] == "failure"
    assert "gpupools.snooze.dev is not installed" in run.line("crds")
    assert lines[("InferenceModel default/qwen3-8b", "engines")] == "failure"
    assert f"it cannot reach {ENGINE_POD}" in run.line("engines")


class Peers:
    """`snooze operator --peering snooze` processes, each standing for one of the Deployment's
    pods (POD_ID, as the chart sets it), killable as a crashed pod."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.running: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, pod: str, priority: int) -> None:
        command = [sys.executable, "-m", "snooze.cli", "operator", "--peering", "snooze"]
        command += ["--priority", str(priority), "--peering-lifetime", "3"]
        with (self.tmp / f"{pod}.log").open("wb") as log:
            self.running[pod] = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "POD_ID": pod}
            )

    def kill(self, pod: str) -> None:
        process = self.running.pop(pod)
        process.send_signal(signal.SIGKILL)
        process.wait(10)

    def stop(self) -> None:
        for process in self.running.values():
            process.terminate()
        for process in self.running.values():
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()


@pytest.fixture
def peers(tmp_path: Path) -> Iterator[Peers]:
    group = Peers(tmp_path)
    yield group
    group.stop()


def peered(sandbox: Sandbox) -> set[str]:
    body = httpx.get(f"{sandbox.url}/apis/kopf.dev/v1/clusterkopfpeerings/snooze").json()
    return set(body.get("status") or {})


def test_the_leader_is_the_live_peer_of_the_highest_priority(
    cluster: Cluster, tmp_path: Path, peers: Peers
) -> None:
    """Two replicas (the chart turns kopf peering on): the higher priority acts; killed, the
    other takes over; a third of the same priority as the one acting pauses them both."""
    deployment = apply_release(
        cluster, tmp_path / "cache", **{"operator.replicas": 2, "operator.peering.name": "snooze"}
    )
    assert "--peering=snooze" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    pods = ["snooze-operator-5d8f7c9b6-aaaaa", "snooze-operator-5d8f7c9b6-bbbbb"]
    start_operator_pods(cluster, deployment, pods)
    add_engine_pod(cluster)
    apply_model(cluster)
    peers.start(pods[0], priority=200)
    peers.start(pods[1], priority=100)
    wait_for("both peers", lambda: peered(cluster.sandbox) == set(pods), timeout=30)
    first = check()
    assert f"pod {pods[0]} acts (priority 200); 1 standing by" in first.line("leader")
    assert "ok" in first.line("leader").split()[0]

    peers.kill(pods[0])

    def taken_over() -> Run | None:
        run = check()
        return run if f"pod {pods[1]} acts (priority 100)" in run.line("leader") else None

    wait_for("the standby to lead", taken_over, timeout=30)
    peers.start("snooze-operator-5d8f7c9b6-ccccc", priority=100)
    wait_for("the third peer", lambda: len(peered(cluster.sandbox)) >= 2, timeout=30)

    def paused() -> Run | None:
        run = check()
        return run if "share the top priority 100" in run.line("leader") else None

    run = wait_for("both paused", paused, timeout=30)
    assert run.code == 1 and run.line("leader").startswith("  FAILURE")


def test_pools_whose_members_are_on_two_nodes_or_off_the_claim_fail(cluster: Cluster) -> None:
    """No operator at all here: the pools' lines judge what the API holds."""
    labels = {"app": "chat"}
    for name, node, claims in [
        ("chat-0", "gpu-node-1", ["gpu-a"]),
        ("chat-1", "gpu-node-2", ["gpu-a"]),
        ("chat-2", "gpu-node-1", []),
    ]:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": labels},
            "spec": {
                "nodeName": node,
                "containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.33.0"}],
                "resourceClaims": [{"name": c, "resourceClaimName": c} for c in claims],
            },
        }
        cluster._check(cluster.http.post("/api/v1/namespaces/default/pods", json=pod))
        cluster.set_pod_ready(name, next_address(), ready=True)
    pool = {
        "apiVersion": "snooze.dev/v1alpha1",
        "kind": "GPUPool",
        "metadata": {"name": "shared-h100", "namespace": "default"},
        "spec": {"memory": "79Gi", "resourceClaimName": "gpu-a"},
    }
    cluster._check(
        cluster.http.post("/apis/snooze.dev/v1alpha1/namespaces/default/gpupools", json=pool)
    )
    cluster.create_model(
        "chat", {"selector": {"matchLabels": labels}, "pool": {"name": "shared-h100"}}
    )
    run = check("--namespace", "default")
    assert run.code == 1
    lines = run.lines()
    assert lines[("GPUPool default/shared-h100", "members-node")] == "failure"
    assert "gpu-node-1: chat-0, chat-2; gpu-node-2: chat-1" in run.line("members-node")
    assert lines[("GPUPool default/shared-h100", "members-claim")] == "failure"
    assert "chat-2 are members but do not reference its ResourceClaim gpu-a" in run.line(
        "members-claim"
    )
    assert lines[("Cluster", "operator")] == "failure"  # none installed
    assert lines[("InferenceModel default/chat", "model")] == "failure"  # none reported


def test_an_api_server_that_does_not_answer_is_one_line_at_once(tmp_path: Path) -> None:
    """Every other read would fail the same way after its retries: one line, in seconds."""
    port = free_port()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1", "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )  # fmt: skip
    run = check("--kubeconfig", str(kubeconfig))
    assert run.code == 1 and "Traceback" not in run.err
    assert run.lines() == {("Cluster", "api"): "failure"}
    assert f"no answer from the API server at http://127.0.0.1:{port}" in run.line("api")
    assert run.seconds < 15
