"""The operator and the gateway export the standard process_* series next to their own (and
the gateway's metrics port answers at /idle too)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from ports import free_port
from processes import Process
from waits import wait_for

from .conftest import Cluster

PROCESS = (
    "process_cpu_seconds_total",
    "process_resident_memory_bytes",
    "process_start_time_seconds",
)


@pytest.mark.parametrize(
    ("command", "own"),
    [("operator", "snooze_operator_build_info"), ("gateway", "snooze_gateway_build_info")],
)
def test_process_series(cluster: Cluster, tmp_path: Path, command: str, own: str) -> None:
    port = free_port()
    extra = ["--port", str(free_port()), "--host", "127.0.0.1"] if command == "gateway" else []
    process = Process(tmp_path / f"{command}.log", command, "--metrics-port", str(port), *extra)

    def scrape() -> str:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/metrics").text
        except httpx.HTTPError:
            return ""

    idle = None
    try:
        text = wait_for("metrics served", scrape, timeout=30)
        if command == "gateway":  # and beside its page, where the operator waits (its /idle)
            query = {"after": 0, "timeout": 0}
            idle = httpx.get(f"http://127.0.0.1:{port}/idle", params=query)
    finally:
        process.stop()
    if idle is not None:
        assert (idle.status_code, idle.text) == (200, "0\n")
    names = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line[:1] != "#"}
    for name in (*PROCESS, own):
        assert name in names, name
