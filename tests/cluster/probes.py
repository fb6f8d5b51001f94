"""A container's readiness and liveness probes as the harness's kubelet runs them: httpGet and
tcpSocket as the kubelet does; a gRPC probe as a connection to its port (the health service is
not asked); exec probes are not run (they pass)."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any


@dataclass
class Probe:
    """One container's readiness or liveness probe, as its spec says."""

    spec: Any
    ports: dict[str, int]
    period: float
    failures: int = 0
    successes: int = 0
    last: float = 0.0

    def due(self, started: float, now: float) -> bool:
        initial = self.spec.initial_delay_seconds or 0
        return now - started >= initial and now - self.last >= self.period

    def check(self, address: str) -> bool:
        self.last = time.monotonic()
        timeout = self.spec.timeout_seconds or 1
        if self.spec.http_get is not None:
            get = self.spec.http_get
            port = get.port if isinstance(get.port, int) else self.ports.get(get.port, 0)
            url = f"http://{address}:{port}{get.path or '/'}"
            try:
                with urllib.request.urlopen(url, timeout=timeout) as answer:
                    ok = 200 <= answer.status < 400
            except (urllib.error.URLError, OSError, ValueError):
                ok = False
        elif self.spec.tcp_socket is not None or self.spec.grpc is not None:
            # A gRPC probe is a connection to its port here: the health service is not asked.
            tcp = self.spec.tcp_socket or self.spec.grpc
            port = tcp.port if isinstance(tcp.port, int) else self.ports.get(tcp.port, 0)
            try:
                with socket.create_connection((address, port), timeout=timeout):
                    ok = True
            except OSError:
                ok = False
        else:
            ok = True  # exec probes are not run here
        if ok:
            self.successes += 1
            self.failures = 0
        else:
            self.failures += 1
            self.successes = 0
        return ok
