"""A WSGI app served on a port from a daemon thread, a thread per connection, with the
connections bounded in number and in time (connections.py): prometheus_client's own server
(start_http_server) keeps a thread for each connection until its client speaks, so whoever
reaches its port could exhaust the process with idle connections."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any, cast
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client.exposition import ThreadingWSGIServer

from snooze.api.listening import CannotListen
from snooze.metricsport.connections import IO_TIMEOUT, Connections

ACCEPT_QUEUE = 1024
"""Connections the kernel holds until the port takes them (Linux caps it at somaxconn)."""
ANSWER_TIME = 15.0
"""Seconds a connection has, beyond any wait of its own, to send its request and read its
answer: more than a scrape may take (Prometheus gives up after 10 s by default)."""

log = logging.getLogger(__name__)

StartResponse = Callable[[str, list[tuple[str, str]]], Any]
App = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


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
            name = cast(_BoundedServer, self.server).name
            log.debug("%s: connection from %s ended: %r", name, self.client_address, exc)

    def log_message(self, format: str, *args: Any) -> None:
        """Every scrape or probe would be a line on stderr."""

    def get_stderr(self) -> Any:
        """Where wsgiref prints a failed answer's traceback (a client gone, or too slow to
        read it): the debug log, not the process's terminal."""
        return _DebugLog(cast(_BoundedServer, self.server).name)


class _DebugLog:
    def __init__(self, name: str) -> None:
        self.name = name

    def write(self, text: str) -> None:
        if text.strip():
            log.debug("%s: %s", self.name, text.rstrip())

    def flush(self) -> None:
        pass


class _BoundedServer(ThreadingWSGIServer):
    """A thread per connection, at most MOST_CONNECTIONS of them, each within its deadlines
    (connections.py), checked at every turn of the accept loop."""

    name: str
    connections: Connections
    # The kernel's queue of connections not yet accepted. When full, it drops new ones and
    # their clients retry 1, 3, 7, 15 and 31 s later: a flood of a few hundred held the
    # scraper's own connection back that long, though each is taken in about a millisecond.
    request_queue_size = ACCEPT_QUEUE

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
        log.warning("%s: answering %s failed", self.name, client_address, exc_info=True)


def serve(
    port: int,
    app: App,
    *,
    name: str,
    longest_wait: float = 0.0,
    addr: str = "0.0.0.0",
) -> tuple[WSGIServer, threading.Thread]:
    """Serve `app` on `port` from a daemon thread named `name` (also the log lines' prefix),
    a thread per connection (bounded); `longest_wait` is the longest the app itself may keep
    a request waiting, on top of ANSWER_TIME. CannotListen when the port cannot be had; the
    server's `shutdown()` stops it."""
    family, _, _, _, address = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0]

    class Server(_BoundedServer):
        address_family = family

    Server.name = name
    Server.connections = Connections(lifetime=longest_wait + ANSWER_TIME)
    try:
        server = make_server(str(address[0]), port, app, Server, handler_class=_Handler)
    except OSError as exc:
        raise CannotListen(addr, port, exc) from exc
    thread = threading.Thread(target=server.serve_forever, daemon=True, name=name)
    thread.start()
    return server, thread
