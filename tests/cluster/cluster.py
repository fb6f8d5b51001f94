"""A whole test cluster on this machine: the pod network, the control plane, one Node kept by
KWOK, and the runtime that runs its Pods; or an existing cluster a kubeconfig points at.

Run `python tests/cluster/cluster.py` to start one by hand: it prints a kubeconfig's path
and serves until Ctrl-C, then removes everything it made.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import buildcontext
import kubernetes
import yaml
from controlplane import ROOT, ClusterError, ControlPlane, Process, binaries, kubeconfig
from kubelet import Image, Runtime
from network import PodNetwork

NODE = "snooze-node"
SUBNET = os.environ.get("SNOOZE_CLUSTER_SUBNET", "10.217.0.0/24")
IMAGE = "snooze.test/snooze"
"""The image name the tests give the chart: the runtime runs it from this tree, as it runs the
chart's default image (values.yaml), which the examples name too."""
KWOK_CONFIG = Path(__file__).with_name("kwok.yaml")


def snooze_image(workdir: Path) -> Image:
    """The operator image (images/operator/Dockerfile) as the runtime runs it: its ENTRYPOINT
    and ENV, with the package as its build context holds it (no sandbox, no demo: what the
    cluster runs must not need them) in place of the image's installed copy."""
    dockerfile = (ROOT / "images" / "operator" / "Dockerfile").read_text()
    entry = re.search(r'^ENTRYPOINT \["([^"]+)"\]', dockerfile, re.M)
    if entry is None:
        raise ClusterError('images/operator/Dockerfile has no ENTRYPOINT ["..."] line')
    # The image's `snooze` is `python -m snooze.cli` from /opt/snooze; here, from this tree.
    if entry.group(1) != "snooze":
        raise ClusterError(f"the image's entry point is {entry.group(1)!r}, not snooze")
    context = buildcontext.image_context(workdir / "image")
    env = {"PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONPATH": str(context / "operator")}  # fmt: skip
    return Image(entrypoint=[sys.executable, "-m", "snooze.cli"], env=env, cmd=["--help"])


def _end_leftovers() -> None:
    """Kill control plane processes a killed run left (their binaries are ours, under
    .cache/k8s/); called with the machine's cluster lock held, so none is another run's."""
    ours = str(ROOT / ".cache" / "k8s") + os.sep
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv0 = (entry / "cmdline").read_bytes().split(b"\0", 1)[0].decode()
        except OSError:
            continue
        if argv0.startswith(ours):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGKILL)


def chart_image() -> str:
    """The chart's default image repository (values.yaml's image.repository)."""
    values = yaml.safe_load((ROOT / "charts" / "snooze" / "values.yaml").read_text())
    return str(values["image"]["repository"])


class LocalCluster:
    """Everything on this machine, in a temporary folder removed by `stop()`."""

    def __init__(self, *, keep: bool = False) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="snooze-cluster-"))
        self.keep = keep
        self.network = PodNetwork(SUBNET)
        self.runtime: Runtime | None = None
        self.kwok: Process | None = None
        self.control: ControlPlane | None = None

    @property
    def admin_kubeconfig(self) -> Path:
        assert self.control is not None
        return self.control.kubeconfigs["admin"]

    def start(self) -> None:
        started = time.monotonic()
        bin_dir = binaries()
        try:
            self.network.up()
            _end_leftovers()
            self.control = ControlPlane(self.workdir, self.network.gateway, bin_dir)
            self.control.start()
            self.client = kubernetes.config.new_client_from_config(str(self.admin_kubeconfig))
            self._node()
            self.kwok = Process(
                "kwok",
                [
                    str(bin_dir / "kwok"),
                    f"--kubeconfig={self.admin_kubeconfig}",
                    f"--config={KWOK_CONFIG}",
                    f"--manage-single-node={NODE}",
                    f"--node-ip={self.network.gateway}",
                    f"--node-name={NODE}",
                ],
                self.workdir / "logs" / "kwok.log",
            )
            self.kwok.healthy = self._node_ready
            self.kwok.start()
            self.kwok.wait_healthy(60)
            image = snooze_image(self.workdir)
            self.runtime = Runtime(
                client=self.client,
                node=NODE,
                network=self.network,
                workdir=self.workdir,
                images={name: image for name in (IMAGE, chart_image())},
                api_host=self.network.gateway,
                api_port=self.control.api_port,
                ca=self.control.ca.cert,
            )
            self.runtime.start()
        except BaseException:
            self.stop()
            raise
        print(f"cluster: up in {time.monotonic() - started:.1f} s at {self.control.server}",
              file=sys.stderr)  # fmt: skip

    def _node(self) -> None:
        core = kubernetes.client.CoreV1Api(self.client)
        core.create_node(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": NODE,
                    "labels": {
                        "kubernetes.io/hostname": NODE,
                        "kubernetes.io/os": "linux",
                        "kubernetes.io/arch": "amd64",
                        "type": "kwok",
                    },
                    "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
                },
                "spec": {"podCIDR": SUBNET, "podCIDRs": [SUBNET]},
            }
        )

    def _node_ready(self) -> bool:
        node = kubernetes.client.CoreV1Api(self.client).read_node(NODE)
        conditions = node.status.conditions or []
        return any(c.type == "Ready" and c.status == "True" for c in conditions)

    def stop(self) -> None:
        if self.runtime is not None:
            self.runtime.stop()
            self.runtime = None
        if self.kwok is not None:
            self.kwok.stop()
            self.kwok = None
        if self.control is not None:
            self.control.stop()
        self.network.down()
        if not self.keep:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def logs(self) -> dict[str, str]:
        """The last lines of each component's log, for a failure's report."""
        out = {}
        for path in sorted((self.workdir / "logs").glob("*.log")):
            out[path.stem] = "\n".join(path.read_text(errors="replace").splitlines()[-20:])
        return out


def main() -> None:
    cluster = LocalCluster(keep="--keep" in sys.argv)
    cluster.start()
    config = Path.cwd() / "snooze-cluster.kubeconfig"
    config.write_text(yaml.safe_dump(yaml.safe_load(cluster.admin_kubeconfig.read_text())))
    print(f"KUBECONFIG={config}  (Ctrl-C stops the cluster and removes everything)")
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:
        done.wait()
    except KeyboardInterrupt:
        pass
    finally:
        # A second Ctrl-C must not cut the clean-up short and leave processes behind.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        cluster.stop()
        config.unlink(missing_ok=True)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()

__all__ = ["IMAGE", "NODE", "ClusterError", "LocalCluster", "kubeconfig"]
