"""A real Kubernetes control plane as processes on this machine: etcd, kube-apiserver (RBAC,
the usual admission plugins, service-account tokens), kube-controller-manager and
kube-scheduler, built from their Go modules by tests/k8s/build."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from pki import Authority, Pair, service_account_keys
from ports import free_port

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "tests" / "k8s" / "build"
SERVICE_CIDR = "10.96.0.0/16"
ISSUER = "https://kubernetes.default.svc.cluster.local"


class ClusterError(RuntimeError):
    """The cluster cannot start or stopped; the message says which part and why."""


def binaries(group: str = "controlplane") -> Path:
    """The directory of a group's binaries (tests/k8s/build: `controlplane`, `epp`,
    `extproc`), built, or found built, by tests/k8s/build."""
    done = subprocess.run(["bash", str(BUILD), group], stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise ClusterError(
            f"tests/k8s/build {group} failed (exit {done.returncode}): see its output above"
        )
    return Path(done.stdout.strip().splitlines()[-1])


def check_free(host: str, port: int, who: str) -> None:
    """Refuse, naming `who`, when something already listens at host:port."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as error:
            raise ClusterError(
                f"{who} cannot listen on {host}:{port}: {error.strerror}; stop what uses it "
                f"(ss -ltnp 'sport = :{port}') or leave the port to the harness"
            ) from None


def kubeconfig(server: str, ca: Path, user: Pair | None = None, token: str | None = None) -> dict:  # type: ignore[type-arg]
    """A kubeconfig for `server` that trusts `ca`, as a client certificate or a token."""
    credentials: dict[str, str] = {}
    if user is not None:
        credentials = {"client-certificate": str(user.cert), "client-key": str(user.key)}
    if token is not None:
        credentials = {"token": token}
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "test", "cluster": {"server": server, "certificate-authority": str(ca)}}
        ],
        "users": [{"name": "test", "user": credentials}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
        "current-context": "test",
    }


@dataclass
class Process:
    """One component: its command, its log, and how to tell it is up."""

    name: str
    argv: list[str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None
    healthy: Callable[[], bool] = field(default=lambda: True)

    def start(self) -> None:
        out = self.log.open("ab")
        self.popen = subprocess.Popen(
            self.argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        out.close()

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.running():
                raise ClusterError(f"{self.name} exited at start; its last lines:\n{self.tail()}")
            if self.healthy():
                return
            time.sleep(0.2)
        raise ClusterError(f"{self.name} was not healthy after {timeout:.0f} s:\n{self.tail()}")

    def stop(self, grace: float = 10.0) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait()


def _https_ok(url: str, context: ssl.SSLContext) -> bool:
    try:
        with urllib.request.urlopen(url, context=context, timeout=2) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


class ControlPlane:
    """etcd, the API server, the controller manager and the scheduler, in `workdir`.

    The API server listens on `address` (the pod network's gateway, so that pods reach it as
    in-cluster clients do) and trusts client certificates of `pki`'s CA; `admin` is a
    system:masters user for the tests and the harness."""

    def __init__(self, workdir: Path, address: str, bin_dir: Path) -> None:
        self.workdir = workdir
        self.address = address
        self.bin = bin_dir
        self.pki_dir = workdir / "pki"
        self.pki_dir.mkdir(parents=True, exist_ok=True)
        self.etcd_port = free_port("127.0.0.1")
        self.etcd_peer_port = free_port("127.0.0.1")
        self.api_port = free_port(address)
        self.processes: list[Process] = []

    @property
    def server(self) -> str:
        return f"https://{self.address}:{self.api_port}"

    def _certificates(self) -> None:
        self.ca = Authority(self.pki_dir)
        self.serving = self.ca.issue(
            "apiserver",
            common_name="kube-apiserver",
            hosts=(self.address, "127.0.0.1", "10.96.0.1", "localhost", "kubernetes",
                   "kubernetes.default", "kubernetes.default.svc",
                   "kubernetes.default.svc.cluster.local"),
            server=True,
        )  # fmt: skip
        self.admin = self.ca.issue("admin", common_name="admin", organization="system:masters")
        self.sa = service_account_keys(self.pki_dir)
        components = {
            "controller-manager": "system:kube-controller-manager",
            "scheduler": "system:kube-scheduler",
        }
        self.kubeconfigs: dict[str, Path] = {}
        for name, user in components.items():
            pair = self.ca.issue(name, common_name=user)
            self.kubeconfigs[name] = self._write_kubeconfig(name, pair)
        self.kubeconfigs["admin"] = self._write_kubeconfig("admin", self.admin)
        self.tls = ssl.create_default_context(cafile=str(self.ca.cert))
        self.tls.load_cert_chain(str(self.admin.cert), str(self.admin.key))

    def _write_kubeconfig(self, name: str, pair: Pair) -> Path:
        path = self.workdir / f"{name}.kubeconfig"
        path.write_text(yaml.safe_dump(kubeconfig(self.server, self.ca.cert, pair)))
        return path

    def start(self) -> None:
        check_free(self.address, self.api_port, "kube-apiserver")
        self._certificates()
        logs = self.workdir / "logs"
        logs.mkdir(exist_ok=True)
        etcd = Process(
            "etcd",
            [
                str(self.bin / "etcd"),
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{self.etcd_port}",
                f"--advertise-client-urls=http://127.0.0.1:{self.etcd_port}",
                f"--listen-peer-urls=http://127.0.0.1:{self.etcd_peer_port}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{self.etcd_peer_port}",
                f"--initial-cluster=default=http://127.0.0.1:{self.etcd_peer_port}",
                # A test cluster's data need not survive a power cut.
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
            logs / "etcd.log",
        )
        etcd.healthy = lambda: _http_ok(f"http://127.0.0.1:{self.etcd_port}/health")
        self._run(etcd, timeout=30)
        apiserver = Process("kube-apiserver", self._apiserver_argv(), logs / "kube-apiserver.log")
        apiserver.healthy = lambda: _https_ok(f"{self.server}/readyz", self.tls)
        self._run(apiserver, timeout=90)
        self.apiserver = apiserver
        cm_port = free_port("127.0.0.1")
        manager = Process(
            "kube-controller-manager",
            [
                str(self.bin / "kube-controller-manager"),
                f"--kubeconfig={self.kubeconfigs['controller-manager']}",
                f"--authentication-kubeconfig={self.kubeconfigs['controller-manager']}",
                f"--authorization-kubeconfig={self.kubeconfigs['controller-manager']}",
                "--bind-address=127.0.0.1",
                f"--secure-port={cm_port}",
                "--leader-elect=false",
                f"--service-account-private-key-file={self.sa.key}",
                f"--root-ca-file={self.ca.cert}",
                # Each controller acts as its own service account, under RBAC, as in a cluster.
                "--use-service-account-credentials=true",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--controllers=*",
                # Nodes get their pod range from the harness (the pod network's subnet).
                "--allocate-node-cidrs=false",
                # Garbage collection and the ReplicaSet controller act within a second.
                "--concurrent-gc-syncs=5",
            ],
            logs / "kube-controller-manager.log",
        )
        manager.healthy = lambda: _https_ok(f"https://127.0.0.1:{cm_port}/healthz", _insecure())
        self._run(manager, timeout=60)
        sched_port = free_port("127.0.0.1")
        scheduler = Process(
            "kube-scheduler",
            [
                str(self.bin / "kube-scheduler"),
                f"--kubeconfig={self.kubeconfigs['scheduler']}",
                f"--authentication-kubeconfig={self.kubeconfigs['scheduler']}",
                f"--authorization-kubeconfig={self.kubeconfigs['scheduler']}",
                "--bind-address=127.0.0.1",
                f"--secure-port={sched_port}",
                "--leader-elect=false",
            ],
            logs / "kube-scheduler.log",
        )
        scheduler.healthy = lambda: _https_ok(
            f"https://127.0.0.1:{sched_port}/healthz", _insecure()
        )
        self._run(scheduler, timeout=60)

    def _apiserver_argv(self) -> list[str]:
        return [
            str(self.bin / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
            f"--bind-address={self.address}",
            f"--advertise-address={self.address}",
            f"--secure-port={self.api_port}",
            f"--tls-cert-file={self.serving.cert}",
            f"--tls-private-key-file={self.serving.key}",
            f"--client-ca-file={self.ca.cert}",
            f"--service-account-key-file={self.sa.cert}",
            f"--service-account-signing-key-file={self.sa.key}",
            f"--service-account-issuer={ISSUER}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC",
            # The defaults, plus NodeRestriction as kubeadm turns on.
            "--enable-admission-plugins=NodeRestriction",
            "--allow-privileged=true",
            # No kubelet serves logs or exec here; the API server never calls one.
            "--kubelet-preferred-address-types=InternalIP",
            "--profiling=false",
            # Watches end after one to two minutes, and etcd is compacted every 10 s: a
            # client that comes back with an old resourceVersion (after the API server
            # restarts, say) meets 410 Gone and must list again, as on a busy cluster.
            "--min-request-timeout=60",
            "--etcd-compaction-interval=10s",
            "--v=1",
        ]

    def _run(self, process: Process, timeout: float) -> None:
        process.start()
        self.processes.append(process)
        try:
            process.wait_healthy(timeout)
        except ClusterError:
            self.stop()
            raise

    def restart_apiserver(self, down_for: float = 0.0) -> None:
        """Stop the API server, wait `down_for` seconds, and start it again (same port)."""
        self.apiserver.stop()
        time.sleep(down_for)
        self.apiserver.start()
        self.apiserver.wait_healthy(90)

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()
        self.processes.clear()


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _insecure() -> ssl.SSLContext:
    # The controller manager's and scheduler's own serving certificates are self-signed.
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context
