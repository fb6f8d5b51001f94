"""The Gateway API Inference Extension on the test cluster: its InferencePool CRD, read from
the picker's own module (never copied into this tree), the real endpoint picker (v1.5.0,
tests/k8s/epp) as a Deployment with flow control on, and Envoy's part played by
extproc-proxy (tests/k8s/extproc), the one stand-in of that path, on the test's side of the
pod network.

The picker runs as the runtime runs any image it knows: the image name its Helm chart gives
(registry.k8s.io/gateway-api-inference-extension/epp) maps to the binary built here, with the
flags, RBAC and Service that chart gives it."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from controlplane import ROOT, ClusterError, binaries
from kubelet import Image

EPP_MODULE = ROOT / "tests" / "k8s" / "epp"
MODULE = "sigs.k8s.io/gateway-api-inference-extension"
PICKER_IMAGE = "registry.k8s.io/gateway-api-inference-extension/epp"
POOL_GROUP = "inference.networking.k8s.io"
EXT_PROC_PORT = 9002
HEALTH_PORT = 9003
METRICS_PORT = 9090
QUEUE_GAUGE = "inference_extension_flow_control_queue_size"


def module_version() -> str:
    """The picker's release, as tests/k8s/epp/go.mod pins it."""
    for line in (EPP_MODULE / "go.mod").read_text().splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == MODULE:
            return words[1]
    raise ClusterError(f"tests/k8s/epp/go.mod does not require {MODULE}")


def module_dir() -> Path:
    """Where the Go module cache holds the picker's module (downloaded when missing)."""
    done = subprocess.run(
        ["go", "mod", "download", "-json", f"{MODULE}@{module_version()}"],
        cwd=EPP_MODULE, capture_output=True, text=True, timeout=600,
        env={**os.environ, "GOFLAGS": "-mod=readonly"},
    )  # fmt: skip
    if done.returncode != 0:
        raise ClusterError(f"go mod download {MODULE} failed: {done.stderr or done.stdout}")
    return Path(json.loads(done.stdout)["Dir"])


def pool_crd() -> Path:
    """The InferencePool CRD of the picker's release, from its module."""
    path = module_dir() / "config" / "crd" / "bases" / f"{POOL_GROUP}_inferencepools.yaml"
    if not path.is_file():
        raise ClusterError(f"{MODULE} {module_version()} has no InferencePool CRD at {path}")
    return path


def picker_image() -> Image:
    """The picker's image (its Dockerfile's ENTRYPOINT is the binary) as the runtime runs it."""
    return Image(entrypoint=[str(binaries("epp") / "epp")])


# The picker's configuration: the chart's default plugins, and flow control, which holds a
# request while its pool has no ready endpoint (the saturation detector says 1.0 for none)
# until one is, or until the request's TTL.
def picker_config(ttl: str) -> dict[str, Any]:
    return {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
        "kind": "EndpointPickerConfig",
        "featureGates": ["flowControl"],
        "plugins": [
            {"type": "queue-scorer"},
            {"type": "kv-cache-utilization-scorer"},
            {"type": "prefix-cache-scorer"},
            # An engine's metrics older than this make it count as saturated (the default is
            # 200 ms, scraped every 50 ms): the simulated engines of a busy two-core machine
            # answer their /metrics slower than vLLM does.
            {"type": "utilization-detector", "parameters": {"metricsStalenessThreshold": "2s"}},
        ],
        "schedulingProfiles": [
            {
                "name": "default",
                "plugins": [
                    {"pluginRef": "queue-scorer", "weight": 2},
                    {"pluginRef": "kv-cache-utilization-scorer", "weight": 2},
                    {"pluginRef": "prefix-cache-scorer", "weight": 3},
                ],
            }
        ],
        "saturationDetector": {"pluginRef": "utilization-detector"},
        "flowControl": {"defaultRequestTTL": ttl},
    }


def picker_manifests(name: str, namespace: str, selector: dict[str, str], *,
                     ttl: str = "120s") -> list[dict[str, Any]]:  # fmt: skip
    """An InferencePool `name` of the pods `selector` picks, on port 8000, and its picker
    `name`-epp: its ServiceAccount and RBAC (those of the picker's chart: read pods and the
    pool's objects; review tokens for its /metrics), Deployment and Service."""
    epp = f"{name}-epp"
    labels = {"app.kubernetes.io/name": epp}
    read = ["get", "watch", "list"]
    auth = f"{namespace}-{epp}-auth"
    config = yaml.safe_dump(picker_config(ttl))
    container = {
        "name": "epp",
        "image": f"{PICKER_IMAGE}:{module_version()}",
        "args": [
            "--pool-name", name, "--pool-namespace", namespace, "--pool-group", POOL_GROUP,
            "--config-text", config, "--zap-encoder", "json", "--tracing=false",
        ],
        "ports": [
            {"name": "grpc", "containerPort": EXT_PROC_PORT},
            {"name": "grpc-health", "containerPort": HEALTH_PORT},
            {"name": "metrics", "containerPort": METRICS_PORT},
        ],
        # The chart probes the gRPC health service; this runtime runs no gRPC probes, so the
        # ext_proc port's socket says the picker is up.
        "readinessProbe": {"tcpSocket": {"port": EXT_PROC_PORT}, "periodSeconds": 2},
        "env": [
            {"name": "NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ],
    }  # fmt: skip
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": epp, "namespace": namespace}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": epp, "namespace": namespace},
         "rules": [
             {"apiGroups": [""], "resources": ["pods"], "verbs": read},
             {"apiGroups": [POOL_GROUP], "resources": ["inferencepools"], "verbs": read},
             {"apiGroups": ["inference.networking.x-k8s.io"],
              "resources": ["inferenceobjectives", "inferencemodelrewrites"], "verbs": read},
         ]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": epp, "namespace": namespace},
         "subjects": [{"kind": "ServiceAccount", "name": epp, "namespace": namespace}],
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": epp}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": auth},
         "rules": [
             {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"],
              "verbs": ["create"]},
             {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"],
              "verbs": ["create"]},
         ]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": auth},
         "subjects": [{"kind": "ServiceAccount", "name": epp, "namespace": namespace}],
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": auth}},
        {"apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": {"name": epp, "namespace": namespace, "labels": labels},
         "spec": {
             "replicas": 1,
             "strategy": {"type": "Recreate"},
             "selector": {"matchLabels": labels},
             "template": {"metadata": {"labels": labels},
                          "spec": {"serviceAccountName": epp, "containers": [container]}},
         }},
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": epp, "namespace": namespace},
         "spec": {"selector": labels, "ports": [
             {"name": "grpc-ext-proc", "port": EXT_PROC_PORT, "protocol": "TCP"},
             {"name": "http-metrics", "port": METRICS_PORT, "protocol": "TCP"},
         ]}},
        {"apiVersion": f"{POOL_GROUP}/v1", "kind": "InferencePool",
         "metadata": {"name": name, "namespace": namespace},
         "spec": {
             "selector": {"matchLabels": selector},
             "targetPorts": [{"number": 8000}],
             "endpointPickerRef": {"name": epp, "port": {"number": EXT_PROC_PORT}},
         }},
    ]  # fmt: skip


@dataclass
class Proxy:
    """extproc-proxy, running: `url` takes OpenAI requests as Envoy's listener would."""

    url: str
    popen: subprocess.Popen[str]
    lines: list[str]

    def log(self) -> str:
        return "\n".join(self.lines)


def _collect(stream: Any, lines: list[str]) -> None:
    for line in stream:
        lines.append(line.rstrip("\n"))


@contextlib.contextmanager
def proxy(picker: str) -> Iterator[Proxy]:
    """extproc-proxy in front of the picker at `picker` (HOST:9002), on 127.0.0.1."""
    binary = binaries("extproc") / "extproc-proxy"
    popen = subprocess.Popen(
        [str(binary), "-picker", picker, "-listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    assert popen.stdout is not None and popen.stderr is not None
    first = popen.stdout.readline().strip()
    if not first.startswith("listening on "):
        popen.kill()
        raise ClusterError(f"extproc-proxy did not start: {first} {popen.stderr.read()}")
    lines: list[str] = []
    # Its log, one line per request, kept for a failure's report (and so the pipe never fills).
    reader = threading.Thread(target=_collect, args=(popen.stderr, lines), daemon=True)
    reader.start()
    try:
        yield Proxy(url=f"http://{first.removeprefix('listening on ')}", popen=popen, lines=lines)
    finally:
        popen.terminate()
        try:
            popen.wait(10)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait()
        reader.join(5)
