"""The demo's parts as threads and a subprocess: operator, gateway, Prometheus; each one stops."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import shutil
import socket
import subprocess
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from snooze.actions import Settings
from snooze.metrics import OperatorMetrics


class PortInUse(Exception):
    """The gateway's port is taken by another process."""

    def __init__(self, port: int) -> None:
        super().__init__(f"port {port} is in use")
        self.port = port


def check_port(host: str, port: int) -> None:
    """Raise PortInUse now, before anything starts, rather than after a minute of set-up."""
    if port == 0:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                raise PortInUse(port) from None
            raise


class OperatorThread:
    """The real operator (kopf and Snooze's handlers) in a thread with its own event loop."""

    def __init__(self, settings: Settings, metrics: OperatorMetrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="operator", daemon=True)
        self.error: BaseException | None = None

    def start(self) -> OperatorThread:
        self._thread.start()
        if not self._ready.wait(30) or self.error is not None:
            raise RuntimeError(f"the operator did not start: {self.error!r}")
        return self

    def _main(self) -> None:
        import kopf

        from snooze.handlers import Runtime, build_registry

        try:
            asyncio.run(
                kopf.operator(
                    registry=build_registry(Runtime(settings=self.settings, metrics=self.metrics)),
                    clusterwide=True,
                    standalone=True,
                    stop_flag=self._stop,
                    ready_flag=self._ready,
                )
            )
        except BaseException as exc:  # reported by start() or at the end of the run
            self.error = exc
            self._ready.set()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(20)


class GatewayThread:
    """The gateway in a daemon thread with its own loop; `call` reads its state inside it."""

    def __init__(self, settings: Any) -> None:
        from snooze.gateway.server import Gateway
        from snooze.kube import KubeApi

        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="gateway", daemon=True)
        self._settings = settings
        self._gateway_class = Gateway
        self._api_class = KubeApi
        self.gateway: Any = None

    def start(self) -> GatewayThread:
        self._thread.start()

        async def boot() -> Any:
            gateway = self._gateway_class(self._settings, self._api_class.from_environment())
            try:
                await gateway.start()
            except BaseException:
                with contextlib.suppress(Exception):
                    await gateway.stop()
                raise
            return gateway

        self.gateway = self._wait(asyncio.run_coroutine_threadsafe(boot(), self.loop))
        return self

    @staticmethod
    def _wait(future: Future[Any]) -> Any:
        return future.result(30)

    @property
    def port(self) -> int:
        return int(self.gateway.port)

    async def held(self) -> dict[str, int]:
        """Requests held per model name right now, read inside the gateway's loop."""

        async def inside() -> dict[str, int]:
            return {name: count for (_ns, name), count in self.gateway.holds.held.items()}

        if self.gateway is None:
            return {}
        future = asyncio.run_coroutine_threadsafe(inside(), self.loop)
        return await asyncio.wrap_future(future)

    def stop(self) -> None:
        if self.gateway is not None:
            with contextlib.suppress(Exception):
                self._wait(asyncio.run_coroutine_threadsafe(self.gateway.stop(), self.loop))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self.loop.close()


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
        return self

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)
