"""Shared set-up for the gateway benchmarks: a sandbox API, one simulated engine, processes."""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml

from snooze.sandbox import Sandbox
from snooze.sandbox.emulator import SandboxEmulator
from snooze.sim.loopback import claim_octet

ROOT = Path(__file__).resolve().parents[1]
CRD = ROOT / "crds" / "inferencemodels.snooze.dev.yaml"
NS = "default"
WRITES = ("POST", "PUT", "PATCH", "DELETE")
# /api/v1/namespaces/NS/pods/NAME/status, /apis/GROUP/VERSION/namespaces/NS/PLURAL/NAME...
_RESOURCE = re.compile(r"^/apis?/(?:[^/]+/)?[^/]+/namespaces/([^/]+)/([^/]+)(?:/[^/]+(/[^/]+)?)?$")


class WriteCounter(SandboxEmulator):
    """The sandbox's emulator, counting the writes it answers by namespace, resource and
    subresource (`pods`, `pods/status`, `inferencemodels/status`, `events`...): what the
    operator costs the API server, seen from the server's side."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: collections.Counter[tuple[str, str]] = collections.Counter()

    def _take_fault(self, method: str, path_qs: str) -> Any:
        found = _RESOURCE.match(path_qs.partition("?")[0])
        if method in WRITES and found is not None:
            namespace, plural, sub = found.groups()
            self.writes[(namespace, plural + (sub or ""))] += 1
        return super()._take_fault(method, path_qs)

    def count(self, namespace: str | None = None) -> collections.Counter[str]:
        """Writes so far, by resource, of one namespace (None: all)."""
        found: collections.Counter[str] = collections.Counter()
        for (where, what), n in self.writes.copy().items():
            if namespace is None or where == namespace:
                found[what] += n
        return found


OCTETS = range(220, 250)
"""The benchmarks' second octets of 127.x.y.z; the e2e tests claim 127.20 to 127.219."""


@functools.cache
def _claimed_octet() -> tuple[int, socket.socket]:
    """The octet this process claims, once, while it lives."""
    return claim_octet(OCTETS)


def loopback(third: int, fourth: int) -> str:
    """An engine's loopback address, under the octet this process claims: a benchmark run
    beside another, or beside the tests, never binds an address the other has."""
    return f"127.{_claimed_octet()[0]}.{third}.{fourth}"


def engine_host() -> str:
    """The address of the gateway benchmarks' one simulated engine."""
    return loopback(77, 2)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(what: str, check: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if check():
                return
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {what}")


class Bench:
    """The sandbox in this process; engine, gateway (and operator) as separate processes, so
    that the load generator does not share their interpreter lock."""

    def __init__(self, sandbox: Sandbox, workdir: Path) -> None:
        self.sandbox = sandbox
        self.api = httpx.Client(base_url=sandbox.url, timeout=10)
        self.env = {**os.environ, "KUBECONFIG": str(sandbox.write_kubeconfig(workdir / "kc"))}
        self.procs: list[subprocess.Popen[bytes]] = []
        self.gateway_url = ""

    def spawn(self, *args: str) -> None:
        self.procs.append(
            subprocess.Popen(
                [sys.executable, *args],
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )

    def engine(
        self,
        *,
        model: str,
        token_seconds: float,
        wake_seconds: float = 0.3,
        host: str | None = None,
        extra: tuple[str, ...] = (),
    ) -> str:
        host = host or engine_host()
        # The weights' digests an engine's first sleep takes are left out (0 s): these
        # benchmarks measure the gateway and the operator; verify.py measures the checks.
        self.spawn(
            "-m", "snooze.cli", "sim", "--host", host, "--port", "8000",
            "--model", model, "--token-seconds", str(token_seconds),
            "--wake-seconds", str(wake_seconds), "--sleep-seconds", "0.05",
            "--max-concurrency", "512", "--checksum-seconds-per-gib", "0", *extra,
        )  # fmt: skip
        url = f"http://{host}:8000"
        wait_until("the engine", lambda: httpx.get(url + "/health").status_code == 200)
        return url

    def install_crd(self) -> None:
        crd = yaml.safe_load(CRD.read_text())
        self.api.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd)

    def pod_and_model(
        self, name: str, *, state: str | None, spec: dict[str, Any], host: str | None = None
    ) -> None:
        host = host or engine_host()
        self.install_crd()
        labels = {"app": name, **({"snooze.dev/state": state} if state else {})}
        pods = f"/api/v1/namespaces/{NS}/pods"
        self.api.post(pods, json={"metadata": {"name": f"{name}-0", "labels": labels}})
        self.api.patch(
            f"{pods}/{name}-0/status",
            json={
                "status": {
                    "phase": "Running",
                    "podIP": host,
                    "conditions": [{"type": "Ready", "status": "True"}],
                }
            },
            headers={"Content-Type": "application/merge-patch+json"},
        )
        body = {
            "apiVersion": "snooze.dev/v1alpha1",
            "kind": "InferenceModel",
            "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": {"app": name}}, **spec},
        }
        models = f"/apis/snooze.dev/v1alpha1/namespaces/{NS}/inferencemodels"
        response = self.api.post(models, json=body)
        response.raise_for_status()
        if state:
            # No operator runs: write the status it would, since the gateway routes only to
            # pods that the model's status reports awake, under the name the status claims.
            uid = self.api.get(f"{pods}/{name}-0").json()["metadata"]["uid"]
            status = {
                "modelName": name,
                "pods": [{"name": f"{name}-0", "state": state, "uid": uid}],
            }
            self.api.patch(
                f"{models}/{name}/status",
                json={"status": status},
                headers={"Content-Type": "application/merge-patch+json"},
            ).raise_for_status()

    def gateway(self, metrics_port: int | None = None, extra: tuple[str, ...] = ()) -> str:
        """Start the gateway; with `metrics_port`, its Prometheus metrics are served there;
        `extra`: more of its flags."""
        port = free_port()
        code = (
            "import argparse, sys; from snooze.gateway import cli; p = argparse.ArgumentParser();"
            " cli.add_arguments(p); sys.exit(cli.run(p.parse_args(sys.argv[1:])))"
        )
        args = ["--host", "127.0.0.1", "--port", str(port), "--expose-model-status"]
        if metrics_port is not None:
            args += ["--metrics-port", str(metrics_port)]
        self.spawn("-c", code, *args, *extra)
        self.gateway_url = f"http://127.0.0.1:{port}"
        # A minute: a run on a loaded machine (two cores shared with other work, load average
        # 4) once gave up after the default thirty seconds.
        wait_until(
            "the gateway",
            lambda: httpx.get(self.gateway_url + "/readyz").status_code == 200,
            timeout=60,
        )
        return self.gateway_url

    def operator(self) -> None:
        self.spawn("-m", "snooze.cli", "operator", "--probe-interval", "0.1")

    def close(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.api.close()


@contextlib.contextmanager
def bench(emulator: SandboxEmulator | None = None) -> Iterator[Bench]:
    """The sandbox (serving `emulator`, if given) and the processes of one benchmark."""
    sandbox = Sandbox()
    if emulator is not None:
        sandbox.emulator = emulator
    with tempfile.TemporaryDirectory() as tmp, sandbox:
        setup = Bench(sandbox, Path(tmp))
        try:
            yield setup
        finally:
            setup.close()
