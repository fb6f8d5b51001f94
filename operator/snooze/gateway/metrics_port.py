"""The gateway's metrics port: the Prometheus page, and `/idle`, where the operator waits for
the next moment an engine's last request ends instead of scraping the page over and over
while a GPU pool waits for a busy member (operator/traffic/gateways.py). Served by the bounded
server of snooze/metricsport."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, make_wsgi_app

from snooze.api.agreed import IDLE_LONGEST_WAIT, IDLE_PATH
from snooze.metricsport import server
from snooze.metricsport.server import App, StartResponse

# A wait is short (the operator asks for a tenth of its probe interval) and every waiter holds
# a thread: whoever can reach the port may ask, so both are bounded (the longest wait is
# IDLE_LONGEST_WAIT, which the operator knows too).
MOST_WAITERS = 16


class IdleSignal:
    """Counts the moments an engine's last request through this replica ended, and lets
    threads wait for the next one. Counted on the event loop, waited for on the port's
    threads: hence a lock, taken once per request end."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self.count = 0
        self.waiters = 0

    def went_idle(self) -> None:
        with self._changed:
            self.count += 1
            self._changed.notify_all()

    def wait(self, after: int, timeout: float) -> int | None:
        """The count once it differs from `after` (above it, or below it if this replica
        restarted since `after` was read), or as it is after `timeout` seconds; None when
        MOST_WAITERS already wait."""
        with self._changed:
            if self.waiters >= MOST_WAITERS:
                return None
            self.waiters += 1
            try:
                self._changed.wait_for(lambda: self.count != after, timeout)
                return self.count
            finally:
                self.waiters -= 1


def idle_app(signal: IdleSignal) -> App:
    """`GET /idle?after=N&timeout=S`: answers with the count of engines gone idle once it is
    not N, or after S seconds (at most IDLE_LONGEST_WAIT) with the count as it is."""

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        def answer(status: str, text: str) -> list[bytes]:
            start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
            return [text.encode()]

        query = parse_qs(environ.get("QUERY_STRING", ""))
        try:
            after = int(query["after"][0])
            timeout = float(query.get("timeout", ["0"])[0])
        except (KeyError, ValueError):
            return answer("400 Bad Request", "give after=N (an integer) and timeout=SECONDS\n")
        if not 0 <= timeout <= IDLE_LONGEST_WAIT:  # NaN fails both comparisons
            return answer(
                "400 Bad Request", f"timeout must be 0 to {IDLE_LONGEST_WAIT:g} seconds\n"
            )
        count = signal.wait(after, timeout)
        if count is None:
            return answer("429 Too Many Requests", f"{MOST_WAITERS} callers already wait\n")
        return answer("200 OK", f"{count}\n")

    return app


def serve(
    port: int, registry: CollectorRegistry, signal: IdleSignal, addr: str = "0.0.0.0"
) -> tuple[WSGIServer, threading.Thread]:
    """Serve the page (any path but /idle, as Prometheus' own server does) and /idle from a
    daemon thread, a thread per connection (bounded); the server's `shutdown()` stops it."""
    page, idle = make_wsgi_app(registry), idle_app(signal)

    def routed(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        chosen = idle if environ.get("PATH_INFO") == IDLE_PATH else page
        return chosen(environ, start_response)

    return server.serve(
        port, routed, name="metrics port", longest_wait=IDLE_LONGEST_WAIT, addr=addr
    )
