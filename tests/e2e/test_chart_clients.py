"""The chart README's commands for clients, run as printed: the gateway Service's address
(`snooze-gateway.snooze.svc`, what `helm install snooze charts/snooze -n snooze` names it) lists
every model. Cluster DNS is stood in for by a hosts file, in a network and mount namespace of
the test's own: there the name is the loopback, where a real `snooze gateway` listens on the
Service's port (80), against the sandbox with the CRDs and a model applied."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import docs_pages
import pytest
from waits import wait_for

pytestmark = pytest.mark.needs("kubectl", "curl", "bash", "unshare", "nsenter", "ip")

PAGE = "charts/snooze/README.md"
SERVICE = "snooze-gateway.snooze.svc"
PORT = 80  # the chart's gateway.service.port


class Namespace:
    """A loopback, a /tmp and an /etc/hosts of its own, where SERVICE is 127.0.0.1."""

    def __init__(self) -> None:
        if str(docs_pages.ROOT).startswith("/tmp/"):
            pytest.fail("the repository is under /tmp, which the namespace's own /tmp hides")
        as_user = [] if os.geteuid() == 0 else ["--map-root-user"]
        script = (
            "ip link set lo up && mount -t tmpfs tmpfs /tmp && "
            f"echo '127.0.0.1 localhost {SERVICE}' > /tmp/hosts && "
            "mount --bind /tmp/hosts /etc/hosts && echo ready && exec sleep 1d"
        )
        self.holder = subprocess.Popen(
            ["unshare", *as_user, "--net", "--mount", "--propagation", "private", "sh", "-c",
             script],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.holder.stdout is not None
        if self.holder.stdout.readline().strip() != "ready":
            _, err = self.holder.communicate(timeout=10)
            pytest.fail(f"no network and mount namespace here (unshare said: {err.strip()})")
        self.prefix = [
            *("nsenter", f"--target={self.holder.pid}", "--net", "--mount"),
            *(["--user", "--preserve-credentials"] if as_user else []),
            f"--wd={docs_pages.ROOT}",
        ]
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("KUBE")},
            "KUBECONFIG": "/tmp/kubeconfig",
            "KUBECACHEDIR": "/tmp/kubecache",
        }
        self.processes: list[subprocess.Popen[str]] = []

    def start(self, *command: str, log: Path) -> None:
        with log.open("w") as out:
            self.processes.append(
                subprocess.Popen(
                    [*self.prefix, *command],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=self.env,
                    text=True,
                    start_new_session=True,
                )
            )

    def start_sandbox(self, log: Path) -> None:
        """`snooze sandbox` on the namespace's port 6443, its kubeconfig at KUBECONFIG."""
        snooze = (sys.executable, "-m", "snooze.cli")
        self.start(*snooze, "sandbox", "--port", "6443", "--kubeconfig", "/tmp/kubeconfig",
                   log=log)  # fmt: skip
        wait_for("the sandbox's kubeconfig", lambda: "kubeconfig written" in log.read_text())

    def run(self, command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.prefix, "bash", "-c", command], env=self.env, capture_output=True,
            text=True, timeout=120,
        )  # fmt: skip

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self.holder.kill()
        self.holder.wait()


@pytest.fixture
def namespace() -> Iterator[Namespace]:
    space = Namespace()
    yield space
    space.close()


def test_the_clients_commands_list_the_models(namespace: Namespace, tmp_path: Path) -> None:
    [block] = docs_pages.command_blocks(docs_pages.section(PAGE, "## Clients"))
    assert f"http://{SERVICE}/v1" in block.body
    snooze = (sys.executable, "-m", "snooze.cli")
    namespace.start_sandbox(tmp_path / "sandbox.log")
    for manifest in ("crds/", "examples/sandbox/chat.yaml"):
        done = namespace.run(f"kubectl apply -f {manifest}")
        assert done.returncode == 0, done.stderr
    namespace.start(*snooze, "gateway", "--kubeconfig", "/tmp/kubeconfig", "--port", str(PORT),
                    log=tmp_path / "gateway.log")  # fmt: skip
    wait_for(
        "the gateway to know the model",
        lambda: "chat" in namespace.run(f"curl -s http://127.0.0.1:{PORT}/v1/models").stdout,
    )
    # As printed: the Service's name, through the hosts file, to the gateway on its port.
    done = namespace.run(block.body)
    assert done.returncode == 0, done.stderr + (tmp_path / "gateway.log").read_text()[-2000:]
    listed = json.loads(done.stdout)
    assert [m["id"] for m in listed["data"]] == ["chat"], listed
