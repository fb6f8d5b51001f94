"""Request bodies: read within bounds, decoded, counted against a global budget, and parsed
off the event loop when large.

- Size: at most `max_body_bytes` each, decompressed (a gzip bomb stops there).
- Time: the whole body within `--client-body-timeout`.
- Memory: every body the gateway holds at once (being read, held for a wake, being sent)
  counts against one budget (`--max-buffered-body-bytes`); past it, 503 with Retry-After.
- Encoding: gzip and deflate are decoded here and forwarded plain, without their
  `Content-Encoding` (vLLM does not decode request bodies); any other encoding is refused.
- Parsing: JSON parsing holds the interpreter lock for its whole length (a 4 MiB array of
  numbers takes a fifth of a second), so bodies over PARSE_INLINE_BYTES are parsed in worker
  processes; `/healthz` and every stream keep going meanwhile.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import multiprocessing
import os
import zlib
from concurrent.futures.process import BrokenProcessPool

from aiohttp import web

from snooze.gateway.errors import error_response
from snooze.gateway.request.skim import skim

log = logging.getLogger(__name__)

PARSE_INLINE_BYTES = 64 * 1024
"""Bodies up to this size are parsed on the event loop (a millisecond or two at most)."""
PARSE_WORKERS = max(1, min(2, os.cpu_count() or 1))
DECODERS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
"""zlib's window bits for each Content-Encoding the gateway decodes."""
BUSY_RETRY_SECONDS = 1


class BodyBudget:
    """Bytes of request bodies held at once, across all requests, under one limit."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.peak = 0
        """The most ever held at once (for tests and benchmarks)."""

    def take(self, size: int) -> bool:
        if self.used + size > self.limit:
            return False
        self.used += size
        self.peak = max(self.peak, self.used)
        return True

    def give(self, size: int) -> None:
        self.used -= size


class Reservation:
    """What one request holds of the budget; released once, when the request is answered."""

    def __init__(self, budget: BodyBudget) -> None:
        self.budget = budget
        self.size = 0

    def grow(self, size: int) -> bool:
        if not self.budget.take(size):
            return False
        self.size += size
        return True

    def release(self) -> None:
        self.budget.give(self.size)
        self.size = 0


def _busy(budget: BodyBudget) -> web.Response:
    return error_response(
        503,
        f"the gateway holds {budget.limit} bytes of request bodies already (its "
        f"--max-buffered-body-bytes), mostly requests waiting for models to wake; retry in "
        f"{BUSY_RETRY_SECONDS}s",
        code="gateway_busy",
        headers={"Retry-After": str(BUSY_RETRY_SECONDS)},
        reason="limit",
    )


async def read_body(
    request: web.Request, *, limit: int, seconds: float, hold: Reservation
) -> bytes | web.Response:
    """The body, decoded; or a 408, 413, 415 or 503 in OpenAI's shape."""
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("identity", "", *DECODERS):
        return error_response(
            415,
            f"the gateway cannot read a body with Content-Encoding {encoding!r}; send it plain, "
            "or as gzip or deflate",
            code="unsupported_encoding",
        )
    decoder = zlib.decompressobj(DECODERS[encoding]) if encoding in DECODERS else None
    if decoder is None and request.content_length is not None:
        if request.content_length > limit:
            return _too_big(limit)
        if not hold.grow(request.content_length):  # refused before a byte is read
            return _busy(hold.budget)
    parts: list[bytes] = []
    size = 0
    content = request.content
    try:
        if content.is_eof():
            # The whole body came with its head (most requests): taken as it is, no clock.
            return _taken(content.read_nowait(), parts, size, decoder, encoding, limit, hold)
        async with asyncio.timeout(seconds):
            async for chunk in content.iter_any():
                too_much = _take(chunk, parts, size, decoder, limit, hold)
                if too_much is not None:
                    return too_much
                size += len(parts[-1])
    except TimeoutError:
        late = error_response(
            408,
            f"the request body did not arrive within {seconds:g}s (--client-body-timeout); "
            "send it at once",
            code="request_timeout",
        )
        late.force_close()
        return late
    except zlib.error as exc:
        return error_response(400, f"the request body is not valid {encoding}: {exc}")
    return _finished(parts, decoder, encoding)


def _too_big(limit: int) -> web.Response:
    return error_response(
        413,
        f"the request body is larger than the gateway's limit of {limit} bytes",
        code="body_too_large",
    )


def _take(
    chunk: bytes,
    parts: list[bytes],
    size: int,
    decoder: zlib._Decompress | None,
    limit: int,
    hold: Reservation,
) -> web.Response | None:
    """Decode `chunk` onto `parts` (`size` bytes so far); a 413 or 503 when it may not be."""
    data = chunk
    if decoder is not None:
        # Never more than the limit allows, however well the bytes compress.
        data = decoder.decompress(chunk, limit + 1 - size)
    size += len(data)
    if size > limit or (decoder is not None and decoder.unconsumed_tail):
        return _too_big(limit)
    if size > hold.size and not hold.grow(size - hold.size):
        return _busy(hold.budget)
    parts.append(data)
    return None


def _taken(
    data: bytes,
    parts: list[bytes],
    size: int,
    decoder: zlib._Decompress | None,
    encoding: str,
    limit: int,
    hold: Reservation,
) -> bytes | web.Response:
    """A body read whole at once: checked as a chunk, then finished."""
    refused = _take(data, parts, size, decoder, limit, hold) if data else None
    return refused if refused is not None else _finished(parts, decoder, encoding)


def _finished(
    parts: list[bytes], decoder: zlib._Decompress | None, encoding: str
) -> bytes | web.Response:
    if decoder is not None and not decoder.eof:
        return error_response(400, f"the request body ends before its {encoding} stream does")
    return parts[0] if len(parts) == 1 else b"".join(parts)


class Parser:
    """Reads `model` and `stream` from bodies: small ones at once, large ones in workers."""

    def __init__(self) -> None:
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None

    async def parse(self, raw: bytes) -> tuple[str, bool] | web.Response:
        if len(raw) <= PARSE_INLINE_BYTES:
            result = skim(raw)
        else:
            try:
                result = await asyncio.wrap_future(self._workers().submit(skim, raw))
            except BrokenProcessPool:
                # A worker died (killed for memory, say): the next body gets fresh workers.
                log.warning("a body-parsing worker died; starting new ones")
                self.close()
                return error_response(
                    503,
                    "the gateway could not parse this body now; retry",
                    code="gateway_busy",
                    headers={"Retry-After": "1"},
                    reason="limit",
                )
        if isinstance(result, str):
            param = "model" if "`model`" in result else None
            return error_response(400, result, param=param)
        return result

    def _workers(self) -> concurrent.futures.ProcessPoolExecutor:
        if self._pool is None:
            # Spawned, not forked: the gateway runs threads, which a fork would copy mid-step.
            self._pool = concurrent.futures.ProcessPoolExecutor(
                PARSE_WORKERS, mp_context=multiprocessing.get_context("spawn")
            )
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            with contextlib.suppress(Exception):
                self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
