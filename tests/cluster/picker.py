"""The Gateway API Inference Extension on the test cluster: its InferencePool CRD, read from
the picker's own module (never copied into this tree), the real endpoint picker (v1.5.0,
tests/k8s/epp) as examples/inference-gateway/ deploys it (flow control on), and Envoy's part
played by extproc-proxy (tests/k8s/extproc), the one stand-in of that path, on the test's
side of the pod network.

The picker runs as the runtime runs any image it knows: the image the example names
(registry.k8s.io/gateway-api-inference-extension/epp) maps to the binary built here."""

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
EXAMPLES = ROOT / "examples" / "inference-gateway"
MODULE = "sigs.k8s.io/gateway-api-inference-extension"
PICKER_IMAGE = "registry.k8s.io/gateway-api-inference-extension/epp"
POOL_GROUP = "inference.networking.k8s.io"
EXT_PROC_PORT = 9002
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


def example(name: str) -> list[dict[str, Any]]:
    """The objects of examples/inference-gateway/NAME.yaml, as docs/inference-gateway.md
    prints them."""
    return [doc for doc in yaml.safe_load_all((EXAMPLES / f"{name}.yaml").read_text()) if doc]


def pool_and_picker() -> list[dict[str, Any]]:
    """The example's InferencePool and its picker (ConfigMap, RBAC, Deployment, Service), as
    printed; the picker's image must be the release tests/k8s/epp builds."""
    objects = example("inferencepool") + example("picker")
    [deployment] = [o for o in objects if o["kind"] == "Deployment"]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"{PICKER_IMAGE}:{module_version()}", container["image"]
    return objects


def engines_and_model(image: str, sim_args: list[str], replicas: int) -> list[dict[str, Any]]:
    """The example's vLLM Deployment and InferenceModel, each vLLM container replaced by the
    simulator (Snooze's image running `snooze sim` as the served model): the pods, their gate,
    labels and probes stay as printed. No GPU is asked for."""
    deployment, model = example("qwen3-8b")
    deployment["spec"]["replicas"] = replicas
    pod = deployment["spec"]["template"]["spec"]
    pod["automountServiceAccountToken"] = False
    [container] = pod["containers"]
    served = model["spec"]["modelName"]
    container.update(image=image, args=["sim", "--host", "0.0.0.0", "--port", "8000",
                                        "--model", served, *sim_args])  # fmt: skip
    for key in ("command", "env", "resources", "startupProbe"):
        container.pop(key, None)
    container["readinessProbe"]["periodSeconds"] = 1
    return [deployment, model]


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
