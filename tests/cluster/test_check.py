"""`snooze check` on a real control plane: the install page's command as printed, with the admin's
kubeconfig, against the chart's release and the walkthrough's model (real RBAC answering the
SelfSubjectAccessReviews made by impersonation); a user who may not impersonate, and an operator
whose ServiceAccount lacks permissions, each told so; and an engine checked and cycled in its
pod, as the page's engine command does through a forwarded port (here the pod's address, which
the harness's host reaches)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import docs_pages
import pytest
import yaml
from controlplane import ROOT
from kube import Kube, wait_for

from .conftest import ENGINES, OTHER_TENANT, SYSTEM, image
from .test_walkthrough import EXAMPLE, apply_example, phase

PAGE = "docs/install.md"
SNOOZE = [sys.executable, "-m", "snooze.cli"]
LINE = re.compile(r"^  (ok|warning|FAILURE) +([a-z-]+): ")


def lines(out: str) -> dict[tuple[str, str], str]:
    """(subject, check) -> ok, warning or FAILURE, from `snooze check`'s text output."""
    found: dict[tuple[str, str], str] = {}
    subject = ""
    for line in out.splitlines():
        match = LINE.match(line)
        if match:
            found[(subject, match.group(2))] = match.group(1)
        elif not line.startswith(" "):
            subject = line
    return found


def env_for(kube: Kube, kubeconfig: Path | None = None) -> dict[str, str]:
    """The user's shell: `snooze` and kubectl on PATH, the cluster's kubeconfig."""
    path = os.pathsep.join(
        [str(Path(sys.executable).parent), str(Path(kube.kubectl_path).parent), os.environ["PATH"]]
    )
    return {
        **os.environ,
        "PATH": path,
        "KUBECONFIG": str(kubeconfig or kube.kubeconfig),
        "KUBECACHEDIR": str(kube.cache),
    }


def run(command: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180
    )


def page_commands() -> list[str]:
    """The page's `snooze check` commands: the cluster's, then the engine's."""
    return [c for c in docs_pages.commands(docs_pages.read(PAGE)) if c.startswith("snooze check")]


def test_the_install_pages_check_as_printed(kube: Kube, release: str) -> None:
    apply_example(kube)
    try:
        wait_for("the model Awake", lambda: phase(kube) == "Awake", timeout=120)
        wait_for(
            "its two engines reported",
            lambda: kube.get("im", "chat", ENGINES).get("status", {}).get("awake") == 2,
            timeout=60,
        )
        command = page_commands()[0]
        assert command == "snooze check"
        done = run(command, env_for(kube))
        assert done.returncode == 0, done.stdout + done.stderr
        found = lines(done.stdout)
        operator = f"Operator {SYSTEM}/{release}-operator"
        model = f"InferenceModel {ENGINES}/chat"
        expected = {
            ("Cluster", "api"): "ok",
            ("Cluster", "crds"): "ok",
            (operator, "operator"): "ok",
            (operator, "leader"): "ok",
            (operator, "permissions"): "ok",
            (model, "model"): "ok",
            (model, "pods"): "ok",
            (model, "engines"): "ok",
        }
        assert {key: found.get(key) for key in expected} == expected, done.stdout
        # The same checks, and levels, as the page's sample shows for its cluster.
        sample = docs_pages.blocks(docs_pages.read(PAGE))
        [shown] = [b.body for b in sample if b.lang == "text" and "crds:" in b.body]
        shown_checks = {(s.split()[0], c, level) for (s, c), level in lines(shown).items()}
        run_checks = {(s.split()[0], c, lv) for (s, c), lv in found.items() if (s, c) in expected}
        assert shown_checks == run_checks
        # The real API server judged the operator's permissions: RBAC, by impersonation.
        assert f"system:serviceaccount:{SYSTEM}:{release}-operator may do all" in done.stdout
    finally:
        kube.delete_and_wait(ENGINES, "app.kubernetes.io/name=chat", "-f", str(EXAMPLE))


READER_RULES = [
    {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
     "verbs": ["get"]},
    {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "list"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
    {"apiGroups": ["snooze.dev"], "resources": ["inferencemodels", "gpupools"],
     "verbs": ["get", "list"]},
    {"apiGroups": ["kopf.dev"], "resources": ["clusterkopfpeerings", "kopfpeerings"],
     "verbs": ["get"]},
]  # fmt: skip


def apply(kube: Kube, *objects: dict[str, Any]) -> None:
    kube.apply(list(objects))


def test_who_may_not_impersonate_is_told_what_to_run(
    kube: Kube, release: str, tmp_path: Path
) -> None:
    """A user who may read what the check reads, and not impersonate: the permissions are a
    warning naming `kubectl auth can-i`, nothing else is lost."""
    name = "snooze-checker"
    apply(
        kube,
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": name, "namespace": OTHER_TENANT}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": name}, "rules": READER_RULES},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": name},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": OTHER_TENANT}]},
    )  # fmt: skip
    try:
        token = kube.kubectl("create", "token", name, "-n", OTHER_TENANT).stdout.strip()
        kubeconfig = token_kubeconfig(kube, token, tmp_path / "checker.kubeconfig")
        done = subprocess.run(
            [*SNOOZE, "check", "--kubeconfig", str(kubeconfig), "--output", "json"],
            capture_output=True, text=True, timeout=180, env=env_for(kube, kubeconfig),
        )  # fmt: skip
        document = json.loads(done.stdout)
        by_check = {c["check"]: c for c in document["checks"] if c["subject"]["kind"] != "Engine"}
        permissions = by_check["permissions"]
        assert permissions["level"] == "warning", permissions
        assert "impersonate" in permissions["message"], permissions
        assert "kubectl auth can-i --list --as=system:serviceaccount" in permissions["fix"]
        assert by_check["crds"]["level"] == "ok" and by_check["operator"]["level"] == "ok"
    finally:
        kube.kubectl("delete", "clusterrolebinding,clusterrole", name, "--ignore-not-found")
        kube.kubectl("delete", "serviceaccount", name, "-n", OTHER_TENANT, "--ignore-not-found")


def token_kubeconfig(kube: Kube, token: str, path: Path) -> Path:
    """The admin's cluster entry with only `token` as credentials."""
    config = yaml.safe_load(kube.kubeconfig.read_text())
    context = next(c for c in config["contexts"] if c["name"] == config["current-context"])
    cluster = next(c for c in config["clusters"] if c["name"] == context["context"]["cluster"])
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1", "kind": "Config", "clusters": [cluster],
                "users": [{"name": "token", "user": {"token": token}}],
                "contexts": [{"name": "token",
                              "context": {"cluster": cluster["name"], "user": "token"}}],
                "current-context": "token",
            }
        )
    )  # fmt: skip
    return path


def test_an_operator_whose_account_lacks_permissions_fails_them_by_name(
    kube: Kube, release: str
) -> None:
    """An operator Deployment (scaled to zero) whose ServiceAccount may only read pods in the
    one namespace it watches: every other permission the operator needs is denied by the real
    API server's RBAC, and named."""
    name = "snooze-limited"
    repository, tag = image()
    apply(
        kube,
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": name, "namespace": OTHER_TENANT}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": name, "namespace": OTHER_TENANT},
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": name, "namespace": OTHER_TENANT},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": OTHER_TENANT}]},
        {"apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": {"name": name, "namespace": OTHER_TENANT},
         "spec": {"replicas": 0, "selector": {"matchLabels": {"app": name}},
                  "template": {"metadata": {"labels": {"app": name}},
                               "spec": {"serviceAccountName": name, "containers": [
                                   {"name": "operator", "image": f"{repository}:{tag}",
                                    "args": ["operator", f"--namespace={OTHER_TENANT}"]}]}}}},
    )  # fmt: skip
    try:
        done = subprocess.run(
            [*SNOOZE, "check", "--operator", f"{OTHER_TENANT}/{name}", "--output", "json"],
            capture_output=True, text=True, timeout=180, env=env_for(kube),
        )  # fmt: skip
        assert done.returncode == 1, done.stdout + done.stderr
        checks = json.loads(done.stdout)["checks"]
        [permissions] = [c for c in checks if c["check"] == "permissions"]
        assert permissions["level"] == "failure"
        denied = set(permissions["data"]["denied"])
        assert f"patch inferencemodels/status.snooze.dev in {OTHER_TENANT}" in denied
        assert f"delete pods in {OTHER_TENANT}" in denied
        assert not any(d.startswith(("get pods", "list pods", "watch pods")) for d in denied)
        [operator] = [c for c in checks if c["check"] == "operator"]
        assert operator["level"] == "failure" and "scaled to 0" in operator["message"]
    finally:
        kube.kubectl("delete", "deployment,rolebinding,role,serviceaccount", name,
                     "-n", OTHER_TENANT, "--ignore-not-found")  # fmt: skip


def engine_pod(name: str, container: str, port: int, args: list[str]) -> dict[str, Any]:
    """A pod of the tests' image running `snooze` with `args`, Ready once /health answers on
    `port`, in a namespace no model selects from (the cycle must not meet an operator)."""
    repository, tag = image()
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": OTHER_TENANT, "labels": {"app": name}},
        "spec": {"automountServiceAccountToken": False, "containers": [{
            "name": container, "image": f"{repository}:{tag}", "args": args,
            "ports": [{"containerPort": port}],
            "readinessProbe": {"httpGet": {"path": "/health", "port": port}, "periodSeconds": 1},
        }]},
    }  # fmt: skip


@pytest.mark.local_only  # the engine's address: the harness's host reaches its pods
def test_an_engine_checked_and_cycled_in_its_pod(kube: Kube, release: str) -> None:
    """The page's engine command, pointed at a pod's own address where the page forwards a
    port: a simulated vLLM in a pod no model selects (the cycle must not meet an operator)."""
    name = "check-engine"
    args = ["sim", "--host", "0.0.0.0", "--port", "8000", "--model", "m",
            "--sleep-seconds", "0.3", "--wake-seconds", "0.2"]  # fmt: skip
    pod = engine_pod(name, "vllm", 8000, args)
    kube.apply(pod)
    try:
        [ready] = wait_for("the engine's pod", lambda: kube.ready_pods(OTHER_TENANT, f"app={name}"))
        url = f"http://{ready.status.pod_ip}:8000"
        printed = page_commands()[1]
        command = printed.replace("http://127.0.0.1:8000", url).replace(
            "default/qwen3-8b-6d4f9c7b8-kx2vq", f"{OTHER_TENANT}/{name}"
        )
        assert command != printed and "--cycle" in command
        done = run(command, env_for(kube))
        assert done.returncode == 0, done.stdout + done.stderr
        found = {check: level for (_, check), level in lines(done.stdout).items()}
        assert found == {
            "engine": "ok", "dev-mode": "ok", "sleep-mode": "ok", "serve-args": "ok",
            "known-bugs": "ok", "weight-checker": "ok", "metrics": "ok", "cycle-sleep": "ok",
            "cycle-wake": "ok", "cycle-output": "ok", "cycle-weights": "ok",
        }, done.stdout  # fmt: skip
        # It slept and woke once, as the engine itself counts.
        with kube.http() as http:
            metrics = http.get(f"{url}/metrics").text
        sleeps = (
            r'vllm:sleep_mode_operation_duration_seconds_count\{[^}]*operation="sleep"[^}]*\} 1'
        )
        assert re.search(sleeps, metrics), metrics
    finally:
        kube.kubectl("delete", "pod", name, "-n", OTHER_TENANT, "--ignore-not-found", "--wait")


@pytest.mark.local_only  # the server's address: the harness's host reaches its pods
def test_an_sglang_server_checked_and_cycled_in_its_pod(kube: Kube) -> None:
    """The page's SGLang command, pointed at a pod's own address: a simulated SGLang server
    run as docs/sglang.md says (memory saver, metrics, and a host copy for level 1), in a pod
    no model selects."""
    name = "check-sglang"
    args = ["sim", "--engine", "sglang", "--host", "0.0.0.0", "--port", "30000", "--model", "m",
            "--weights-cpu-backup", "--checksum-seconds-per-gib", "0.05"]  # fmt: skip
    pod = engine_pod(name, "sglang", 30000, args)
    kube.apply(pod)
    try:
        [ready] = wait_for("the server's pod", lambda: kube.ready_pods(OTHER_TENANT, f"app={name}"))
        url = f"http://{ready.status.pod_ip}:30000"
        [printed] = [c for c in page_commands() if "30000" in c]
        command = printed.replace("http://127.0.0.1:30000", url)
        assert command != printed and "--cycle" in command
        done = run(command, env_for(kube))
        assert done.returncode == 0, done.stdout + done.stderr
        found = {check: level for (_, check), level in lines(done.stdout).items()}
        assert found == {
            "engine": "ok", "api-keys": "ok", "memory-saver": "ok", "cpu-backup": "ok",
            "known-bugs": "ok", "weight-checker": "ok", "metrics": "ok", "cycle-sleep": "ok",
            "cycle-wake": "ok", "cycle-output": "ok", "cycle-weights": "ok",
        }, done.stdout  # fmt: skip
        assert "slept at level 1" in done.stdout
        # The server answered the output check's requests, before its sleep and after.
        with kube.http() as http:
            metrics = http.get(f"{url}/metrics").text
        answered = re.findall(r"^sglang:num_requests_total\{[^}]*\} (\S+)$", metrics, re.M)
        assert sum(float(count) for count in answered) >= 2, metrics
    finally:
        kube.kubectl("delete", "pod", name, "-n", OTHER_TENANT, "--ignore-not-found", "--wait")
