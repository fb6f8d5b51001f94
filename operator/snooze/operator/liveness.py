"""The operator's liveness port: `/healthz` answers 200 while the operator's event loop runs
a callback in time, served by the bounded server of snooze/metricsport. kopf's own endpoint,
an aiohttp server on the loop, keeps each connection that sends nothing, and its file
descriptor, for an hour, however many there are: whoever reaches the port could take every
descriptor the process may open."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable
from typing import Any
from wsgiref.simple_server import WSGIServer

from snooze.metricsport import server
from snooze.metricsport.server import App, StartResponse

LOOP_TIMEOUT = 10.0
"""Seconds the event loop has to run the probe's callback before the answer is 503. Longer
than the chart's probe timeout (5 s), so that the kubelet's own timeout judges a slow loop, as
it judged kopf's endpoint on the loop; this bound only frees the connection's thread."""


def liveness_app(loop: asyncio.AbstractEventLoop, timeout: float = LOOP_TIMEOUT) -> App:
    """`GET /healthz`: 200 once `loop` has run a callback scheduled now, 503 when it has not
    within `timeout` seconds or is closed; 404 elsewhere."""

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        def answer(status: str, text: str) -> list[bytes]:
            start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
            return [text.encode()]

        if environ.get("PATH_INFO") != "/healthz":
            return answer("404 Not Found", "the operator's liveness probe is at /healthz\n")
        ran = threading.Event()
        try:
            loop.call_soon_threadsafe(ran.set)
        except RuntimeError:  # the loop is closed: the operator is stopping
            return answer("503 Service Unavailable", "the operator's event loop has stopped\n")
        if not ran.wait(timeout):
            return answer(
                "503 Service Unavailable",
                f"the operator's event loop has not answered within {timeout:g} s\n",
            )
        return answer("200 OK", "ok\n")

    return app


def serve(
    port: int, loop: asyncio.AbstractEventLoop, addr: str = "0.0.0.0"
) -> tuple[WSGIServer, threading.Thread]:
    """Serve /healthz for `loop` from a daemon thread, a thread per connection (bounded);
    CannotListen when the port cannot be had."""
    return server.serve(
        port, liveness_app(loop), name="liveness port", longest_wait=LOOP_TIMEOUT, addr=addr
    )
