"""`snooze` subcommands run as a person runs them: separate processes, their output in a file."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
from ports import free_port

SNOOZE = [sys.executable, "-m", "snooze.cli"]


class Process:
    """One `snooze ...` process; its stdout and stderr go to one log file."""

    def __init__(self, log: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.log = log
        with log.open("wb") as out:
            self.popen = subprocess.Popen(
                [*SNOOZE, *args], stdout=out, stderr=subprocess.STDOUT, env=env
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM, as Kubernetes stops a pod; the exit code."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(5)
            tail = self.output()[-3000:]
            raise AssertionError(f"did not stop within {timeout}s:\n{tail}") from None

    def wait(self, timeout: float = 30.0) -> int:
        return self.popen.wait(timeout)


class GatewayProcess(Process):
    """`snooze gateway` on 127.0.0.1 (against KUBECONFIG), its metrics port beside it, with
    each model's view in /v1/models: what a test reads of it from outside."""

    def __init__(self, log: Path, *flags: str) -> None:
        self.port, self.metrics_port = free_port(), free_port()
        super().__init__(
            log,
            "gateway",
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--metrics-port", str(self.metrics_port),
            "--expose-model-status",
            *flags,
        )  # fmt: skip
        self.url = f"http://127.0.0.1:{self.port}"
        self.metrics = f"http://127.0.0.1:{self.metrics_port}/metrics"

    @property
    def pid(self) -> int:
        return self.popen.pid

    def ready(self) -> bool:
        try:
            return httpx.get(self.url + "/readyz").status_code == 200
        except httpx.HTTPError:
            return False

    def routable(self, model: str) -> bool:
        """Whether it would send a request for `model` to an awake pod now."""
        for entry in httpx.get(self.url + "/v1/models").json()["data"]:
            if entry["id"] == model:
                return bool(entry["snooze"]["awake"])
        return False

    def sample(self, name: str, **labels: str) -> float:
        """A sample of its metrics page (0 when it has none)."""
        wanted = [f'{key}="{value}"' for key, value in labels.items()]
        for line in httpx.get(self.metrics).text.splitlines():
            if line.startswith(name + "{") and all(w in line for w in wanted):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def in_flight(self, pod: str) -> float:
        """Requests in flight to `pod`, as the operator reads them."""
        return self.sample("snooze_gateway_pod_requests_in_flight", pod=pod)

    def memory(self) -> dict[str, int]:
        """VmRSS and VmHWM (the peak since the last reset_peak), in bytes."""
        found = {}
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                found[key] = int(value.split()[0]) * 1024
        return found

    def reset_peak(self) -> None:
        Path(f"/proc/{self.pid}/clear_refs").write_text("5")


@contextlib.contextmanager
def running_gateway(log: Path, *flags: str) -> Iterator[GatewayProcess]:
    """A GatewayProcess once it is ready; stopped after, as a rollout stops it (exit 0)."""
    process = GatewayProcess(log, *flags)
    deadline = time.monotonic() + 60
    while not process.ready():
        assert process.popen.poll() is None, process.output()[-3000:]
        assert time.monotonic() < deadline, "the gateway not ready within 60 s"
        time.sleep(0.1)
    yield process
    assert process.stop() == 0, process.output()[-3000:]
