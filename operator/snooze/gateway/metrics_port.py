"""The gateway's metrics port: the Prometheus page, and `/idle`, where the operator waits for
the next moment an engine's last request ends instead of scraping the page over and over
while a GPU pool waits for a busy member (operator/gateways.py). Its connections are bounded
in number and in time (metrics_connections.py)."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any, cast
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from snooze.gateway.metrics_connections import IO_TIMEOUT, MOST_CONNECTIONS, Connections

# A wait is short (the operator asks for a tenth of its probe interval) and every waiter holds
# a thread: whoever can reach the port may ask, so both are bounded.
LONGEST_WAIT = 30.0
MOST_WAITERS = 16
# A connection's whole life: its longest wait, and time to send its request and read its answer.
LIFETIME = LONGEST_WAIT + 15.0

log = logging.getLogger(__name__)

StartResponse = Callable[[str, list[tuple[str, str]]], Any]


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


def idle_app(signal: IdleSignal) -> Callable[[dict[str, Any], StartResponse], Iterable[bytes]]:
    """`GET /idle?after=N&timeout=S`: answers with the count of engines gone idle once it is
    not N, or after S seconds (at most LONGEST_WAIT) with the count as it is."""

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
        if not 0 <= timeout <= LONGEST_WAIT:  # NaN fails both comparisons
            return answer("400 Bad Request", f"timeout must be 0 to {LONGEST_WAIT:g} seconds\n")
        count = signal.wait(after, timeout)
        if count is None:
            return answer("429 Too Many Requests", f"{MOST_WAITERS} callers already wait\n")
        return answer("200 OK", f"{count}\n")

    return app


class _Handler(WSGIRequestHandler):
    """One request per connection, each read and write bounded by IO_TIMEOUT; the connection
    counts as answered once its request's head is in."""

    timeout = IO_TIMEOUT

    def parse_request(self) -> bool:
        parsed = super().parse_request()
        if parsed:
            cast(_BoundedServer, self.server).connections.answering(self.connection)
        return parsed

    def handle(self) -> None:
        try:
            super().handle()
        except OSError as exc:  # a timeout, a reset, or closed for its deadline
            log.debug("metrics port: connection from %s ended: %r", self.client_address, exc)

    def log_message(self, format: str, *args: Any) -> None:
        """Every scrape would be a line on stderr."""

    def get_stderr(self) -> Any:
        """Where wsgiref prints a failed answer's traceback (a client gone, or too slow to
        read it): the debug log, not the gateway's terminal."""
        return _DebugLog()


class _DebugLog:
    def write(self, text: str) -> None:
        if text.strip():
            log.debug("metrics port: %s", text.rstrip())

    def flush(self) -> None:
        pass


class _BoundedServer(ThreadingWSGIServer):
    """A thread per connection, at most MOST_CONNECTIONS of them, each within its deadlines
    (metrics_connections.py), checked at every turn of the accept loop."""

    connections: Connections
    request_queue_size = MOST_CONNECTIONS

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.connections.admit(request):
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        self.connections.release(request)
        super().shutdown_request(request)

    def service_actions(self) -> None:
        self.connections.reap()

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.warning("metrics port: answering %s failed", client_address, exc_info=True)


def serve(
    port: int, registry: CollectorRegistry, signal: IdleSignal, addr: str = "0.0.0.0"
) -> tuple[WSGIServer, threading.Thread]:
    """Serve the page (any path but /idle, as Prometheus' own server does) and /idle from a
    daemon thread, a thread per connection (bounded); the server's `shutdown()` stops it."""
    page, idle = make_wsgi_app(registry), idle_app(signal)

    def routed(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        chosen = idle if environ.get("PATH_INFO") == "/idle" else page
        return chosen(environ, start_response)

    family, _, _, _, address = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0]

    class Server(_BoundedServer):
        address_family = family
        connections = Connections(lifetime=LIFETIME)

    server = make_server(str(address[0]), port, routed, Server, handler_class=_Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True, name="metrics-port")
    thread.start()
    return server, thread
