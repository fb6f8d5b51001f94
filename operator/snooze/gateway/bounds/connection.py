"""One client connection to the gateway: a bounded wait for each request's head, and errors
in OpenAI's shape for requests that are not even HTTP.

aiohttp keeps a connection that trickles its request head open for as long as its
keep-alive allows (an hour), and answers a malformed request in plain text, logging a
traceback each time. A client that never finishes its head is cut after `head_timeout`
(from connecting, or from the first byte of the next request on a kept-alive connection),
with a 408; an idle kept-alive connection is closed after KEEPALIVE_SECONDS, as nginx does.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError, LineTooLong

from snooze.gateway.errors import error_body, error_response

log = logging.getLogger(__name__)

KEEPALIVE_SECONDS = 75.0
"""How long an idle kept-alive connection stays open (nginx's default)."""
MAX_LINE_BYTES = 8190
"""The longest request line or header line accepted (aiohttp's and nginx's default)."""


def _timeout_bytes(seconds: float) -> bytes:
    body = json.dumps(
        error_body(
            408,
            f"the request's line and headers did not arrive within {seconds:g}s "
            "(--client-header-timeout); the connection is closed",
            code="request_timeout",
        )
    ).encode()
    head = (
        "HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    return head + body


class GatewayConnection(web.RequestHandler):
    """aiohttp's protocol for one connection, with a deadline on each request's head."""

    def __init__(self, manager: web.Server, *, head_timeout: float, **options: Any) -> None:
        super().__init__(
            manager,
            keepalive_timeout=KEEPALIVE_SECONDS,
            max_line_size=MAX_LINE_BYTES,
            max_field_size=MAX_LINE_BYTES,
            **options,
        )
        self.head_timeout = head_timeout
        self._head_timer: asyncio.TimerHandle | None = None
        self._in_request = False
        self._closing = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        # The first byte of a request starts its head's clock (an idle kept-alive connection
        # is the keep-alive timeout's business).
        if data and not (self._in_request or self._closing) and self._head_timer is None:
            self._arm()
        super().data_received(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def close(self) -> None:
        self._closing = True
        self._disarm()
        super().close()

    def force_close(self) -> None:
        self._closing = True
        self._disarm()
        super().force_close()

    def request_began(self) -> None:
        """The head is complete and a handler runs: its body has a deadline of its own."""
        self._in_request = True
        self._disarm()

    def request_ended(self, *, reusable: bool) -> None:
        """The handler is done. When the connection will not carry another request (closed,
        or its body left unread: aiohttp then reads and drops the rest for a while before
        closing), bytes that arrive are no request head and start no clock."""
        self._in_request = False
        if not reusable:
            self._closing = True

    def _arm(self) -> None:
        self._disarm()
        loop = asyncio.get_running_loop()
        self._head_timer = loop.call_later(self.head_timeout, self._head_expired)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_expired(self) -> None:
        self._head_timer = None
        transport = self.transport
        if self._in_request or self._closing or transport is None or transport.is_closing():
            return
        peer = transport.get_extra_info("peername")
        log.info("closed a connection from %s: no complete request head within %gs", peer,
                 self.head_timeout)  # fmt: skip
        transport.write(_timeout_bytes(self.head_timeout))
        self.force_close()
        transport.close()

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """A request that could not be parsed, or a handler that failed: OpenAI's shape, and
        one log line (a traceback only for the gateway's own failures)."""
        if request.writer.output_size > 0:
            raise ConnectionError("the answer has begun; no error can be sent any more")
        if isinstance(exc, LineTooLong) or (
            isinstance(exc, HttpProcessingError) and "Too many headers" in str(exc.message)
        ):
            status, text = (
                431,
                (
                    f"a request line or header is longer than {MAX_LINE_BYTES} bytes, or there are "
                    "too many headers"
                ),
            )
        elif status == 500:
            log.error("the gateway failed on %s %s", request.method, request.path, exc_info=exc)
            text = "the gateway failed on this request (logged); retry, or report it"
        elif status == 504:
            text = "the gateway gave up waiting on this request"
        else:
            first = (message or str(exc or "")).strip().splitlines()
            text = f"the request is not valid HTTP: {first[0] if first else 'unreadable'}"
        if status != 500:
            log.info("refused a request from %s: %s (%s)", request.remote, status, text)
        response = error_response(status, text, code="bad_http")
        response.force_close()
        return response
