"""The operator's /healthz (operator/liveness.py) over real HTTP, for real event loops: it
answers 200 while the loop runs, 503 while the loop is stuck or once it is closed."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from snooze.metricsport import server
from snooze.operator.liveness import liveness_app


@contextmanager
def running_loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield loop
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


@contextmanager
def liveness_port(loop: asyncio.AbstractEventLoop, timeout: float) -> Iterator[str]:
    port, thread = server.serve(
        0, liveness_app(loop, timeout), name="liveness port", addr="127.0.0.1"
    )
    try:
        yield f"http://127.0.0.1:{port.server_port}"
    finally:
        port.shutdown()
        port.server_close()
        thread.join(5)


def test_a_running_loop_is_alive_and_other_paths_are_not_found() -> None:
    with running_loop() as loop, liveness_port(loop, timeout=5) as url:
        answer = httpx.get(f"{url}/healthz")
        assert (answer.status_code, answer.text) == (200, "ok\n")
        answer = httpx.get(f"{url}/metrics")
        assert answer.status_code == 404 and "/healthz" in answer.text


def test_a_stuck_loop_fails_the_probe_until_it_runs_again() -> None:
    with running_loop() as loop, liveness_port(loop, timeout=0.3) as url:
        loop.call_soon_threadsafe(time.sleep, 2)  # blocks the loop, as a stuck handler would
        answer = httpx.get(f"{url}/healthz", timeout=10)
        assert answer.status_code == 503
        assert answer.text == "the operator's event loop has not answered within 0.3 s\n"
        deadline = time.monotonic() + 10
        while (answer := httpx.get(f"{url}/healthz", timeout=10)).status_code != 200:
            assert time.monotonic() < deadline, answer.text
        assert answer.text == "ok\n"


def test_a_closed_loop_fails_the_probe_at_once() -> None:
    loop = asyncio.new_event_loop()
    loop.close()
    with liveness_port(loop, timeout=30) as url:
        # The client gives up long before the loop's timeout: the answer must not wait for it.
        answer = httpx.get(f"{url}/healthz", timeout=10)
        assert (answer.status_code, answer.text) == (503, "the operator's event loop has stopped\n")
