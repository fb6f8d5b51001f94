"""The demo's services beyond the operator and gateway threads: port checks, Prometheus."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import httpx

from snooze.api.listening import CannotListen


def check_port(host: str, port: int) -> None:
    """Raise CannotListen now, before anything starts, rather than after a minute of set-up."""
    if port == 0:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise CannotListen(host, port, exc) from None


ATTEMPTS = 3
READY_SECONDS = 60.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Prometheus:
    """A real `prometheus` scraping the demo's metrics endpoints every second."""

    def __init__(self, *, targets: dict[str, str], out: Path) -> None:
        self.targets = targets
        self.out = out
        self.port = free_port()
        self.interval = 1  # seconds: the dashboard's rates then resolve the demo's minute
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Prometheus:
        binary = shutil.which("prometheus")
        if binary is None:
            raise RuntimeError(
                "--prometheus needs the `prometheus` binary on PATH "
                "(apt-get install prometheus, or prometheus.io/download)"
            )
        config = self.out / "prometheus.yml"
        jobs = "".join(
            f"  - job_name: {job}\n    static_configs: [{{targets: ['{target}']}}]\n"
            for job, target in self.targets.items()
        )
        config.write_text(
            f"global: {{scrape_interval: {self.interval}s, evaluation_interval: "
            f"{self.interval}s}}\nscrape_configs:\n{jobs}"
        )
        # The port was free when chosen, but another process may bind it before Prometheus
        # does (the kernel hands a released port to the next to ask): then choose again.
        # Any other failure is said at once, with Prometheus's own words.
        for _ in range(ATTEMPTS):
            self._launch(binary, config)
            if self._answers():
                return self
            said = (self.out / "prometheus.log").read_text(errors="replace")
            if "address already in use" not in said:
                raise RuntimeError(f"prometheus did not start; its log:\n{said[-2000:]}")
            self.port = free_port()
        raise RuntimeError(
            f"prometheus did not start ({ATTEMPTS} ports tried); its log:\n{said[-2000:]}"
        )

    def _launch(self, binary: str, config: Path) -> None:
        log = (self.out / "prometheus.log").open("wb")
        self.process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={self.out / 'prometheus-data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            # Its own process group: the terminal's Ctrl-C reaches the demo, which stops it.
            start_new_session=True,
        )
        log.close()

    def _answers(self) -> bool:
        """Wait until it answers /-/ready (True), or exits (False); a minute at most."""
        assert self.process is not None
        deadline = time.monotonic() + READY_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            try:
                if httpx.get(self.url + "/-/ready", timeout=2).status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        return False

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)
