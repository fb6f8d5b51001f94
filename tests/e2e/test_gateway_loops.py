"""`snooze gateway` runs on uvloop where it is installed and on asyncio's own loop where it is
not (or when asked): either way it proxies a stream and drains on SIGTERM, and its log says
which loop runs. A missing uvloop is simulated by making its import fail in the process."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest
from conftest import Cluster, wait_for
from test_gateway_shutdown import GatewayProcess, free_port, models, stream

__all__ = ["models"]  # the fixture, imported to be found by pytest

# `snooze` as its console script runs it, in a process where `import uvloop` fails.
WITHOUT_UVLOOP = "import sys; sys.modules['uvloop'] = None; from snooze.cli import main; main()"


class Launched(GatewayProcess):
    def __init__(self, *, without_uvloop: bool, flags: tuple[str, ...]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        head = ["-c", WITHOUT_UVLOOP] if without_uvloop else ["-m", "snooze.cli"]
        self.proc = subprocess.Popen(
            [sys.executable, *head, "gateway", "--host", "127.0.0.1", "--port", str(self.port),
             *flags],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip


@pytest.fixture
def launched(request: pytest.FixtureRequest, models: None) -> Iterator[Launched]:
    without_uvloop, flags = request.param
    gateway = Launched(without_uvloop=without_uvloop, flags=flags)
    try:
        wait_for("the gateway ready", gateway.ready, timeout=30)
        yield gateway
    finally:
        if gateway.proc.poll() is None:
            gateway.proc.kill()
        gateway.proc.wait(10)


@pytest.mark.parametrize(
    ("launched", "loop"),
    [
        ((False, ()), "uvloop"),
        ((False, ("--event-loop", "asyncio")), "asyncio"),
        ((True, ()), "asyncio"),
    ],
    indirect=["launched"],
    ids=["default-uvloop", "asked-asyncio", "uvloop-absent"],
)
def test_the_gateway_streams_and_drains_on_the_loop_its_log_names(
    cluster: Cluster, launched: Launched, loop: str
) -> None:
    code, events = stream(launched.url, "chat", 5)
    assert code == 200 and events[-1] == "data: [DONE]" and len(events) == 7, events
    assert cluster.engines["chat-0"].requests_served == 1
    launched.proc.send_signal(signal.SIGTERM)
    assert launched.proc.wait(30) == 0
    output = launched.proc.stdout.read() if launched.proc.stdout else ""
    assert f"event loop: {loop}" in output, output
    assert "Traceback" not in output, output


def test_asking_for_uvloop_where_it_is_absent_is_a_clear_error(models: None) -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_UVLOOP, "gateway", "--event-loop", "uvloop"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "uvloop is not installed here" in done.stderr, done.stderr
    assert "--event-loop asyncio" in done.stderr
    assert "Traceback" not in done.stderr
