"""Hostile engines, in a process of their own: `/metrics` answers that are huge, that drip a
byte at a time, or that carry values no engine can have, each counting what it was asked and
what it managed to send.

A control port on 127.0.0.1 adds engines and reads them back:
- `POST /engines` with `{"host": ADDRESS, "kind": KIND, ...}` serves an engine on ADDRESS:8000
  (posting the same host again replaces its behaviour);
- `GET /engines`: per address, the requests it got (`requests`, by path), the bytes of
  answers it wrote (`sent`), the answers still being written (`open`) and the longest time
  one was (`longest`, in seconds: how long the reader stayed).

Kinds:
- `huge`: `bytes` bytes of well-formed Prometheus text (the probe's gauges first, then one
  histogram's buckets over and over, ending with a whole line), streamed in chunks of 1 MiB, with
  a `Content-Length` only if `length` is true;
- `drip`: the head at once, then one byte of a valid page every `interval` seconds, forever;
- `page`: `text`, whole;
- `contradicts`: an engine whose `/metrics` says it sleeps at level 1 while `/is_sleeping`
  says it is awake, whatever it was told;
- `flips`: an engine whose sleep-state gauge says the opposite at each scrape, while
  `/is_sleeping` follows what it was told;
- `honest`: an engine that sleeps and wakes as told, and says so (`asleep`: how it starts);
- `flaps`: the same, with a request running at every other scrape: busy and idle by turns.
`/is_sleeping` answers `{"is_sleeping": false}` for the first three kinds, `/health` 200;
`/sleep` and `/wake_up` answer 200 and count in `requests`; `calls` lists the last thousand
requests as [path, time], the time in seconds since the epoch.

What an engine answers on the inference routes (`/v1/chat/completions`, `/v1/completions`),
its `answer`:
- `huge`: a completion of `bytes` bytes, not streamed, in chunks of 1 MiB as fast as they are
  taken, with a `Content-Length` only if `length` is true;
- `endless`: a completion that never ends, as fast as it is taken;
- `silent`: nothing, ever (an engine asleep while its metrics say awake): it reads the
  request and holds it until the client leaves (`longest` says how long that took);
- none (the default): 404.

Usage: python hostile_engines.py --control-port PORT
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from snooze.sim.host import raise_fd_limit

GAUGES = (
    "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"
    'vllm:engine_sleep_state{sleep_state="awake"} 1\n'
)
BUCKETS = "".join(
    f'vllm:e2e_request_latency_seconds_bucket{{engine="0",le="{n}.0"}} {n}\n' for n in range(200)
).encode()
CHUNK = 1 << 20
INFERENCE = ("/v1/chat/completions", "/v1/completions")
DISCONNECTED = (ConnectionError, asyncio.CancelledError)


@dataclass
class Engine:
    kind: str
    bytes: int = 0
    length: bool = False
    interval: float = 0.1
    text: str = ""
    answer: str = ""
    asleep: bool = False
    """What `/sleep` and `/wake_up` last made it (the told kinds)."""
    scrapes: int = 0
    requests: dict[str, int] = field(default_factory=dict)
    calls: deque[tuple[str, float]] = field(default_factory=lambda: deque(maxlen=1000))
    sent: int = 0
    open: int = 0
    longest: float = 0.0

    def report(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "requests": self.requests,
            "sent": self.sent,
            "open": self.open,
            "longest": round(self.longest, 3),
            "calls": list(self.calls),
        }

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """One answer being written, until the reader leaves or it ends."""
        began = time.monotonic()
        self.open += 1
        try:
            yield
        except DISCONNECTED:
            pass  # the reader gave up: what it took is counted
        finally:
            self.open -= 1
            self.longest = max(self.longest, time.monotonic() - began)


class Engines:
    def __init__(self) -> None:
        self.by_host: dict[str, Engine] = {}
        self.runners: dict[str, web.AppRunner] = {}

    def engine(self, request: web.Request) -> Engine:
        host = request.transport.get_extra_info("sockname")[0] if request.transport else ""
        engine = self.by_host[host]
        engine.requests[request.path] = engine.requests.get(request.path, 0) + 1
        engine.calls.append((request.path, time.time()))
        return engine

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        engine = self.engine(request)
        if engine.kind == "page":
            engine.sent += len(engine.text.encode())
            return web.Response(text=engine.text)
        if engine.kind == "drip":
            return await drip(request, engine, GAUGES.encode())
        if engine.kind in TOLD:
            engine.scrapes += 1
            return web.Response(text=told_page(engine))
        return await huge(request, engine)

    async def is_sleeping(self, request: web.Request) -> web.StreamResponse:
        engine = self.engine(request)
        told = engine.kind in ("flips", "honest", "flaps") and engine.asleep
        return web.json_response({"is_sleeping": told})

    async def sleep(self, request: web.Request) -> web.StreamResponse:
        self.engine(request).asleep = True
        return web.Response()

    async def wake_up(self, request: web.Request) -> web.StreamResponse:
        self.engine(request).asleep = False
        return web.Response()

    async def health(self, request: web.Request) -> web.StreamResponse:
        self.engine(request)
        return web.Response()

    async def add(self, request: web.Request) -> web.Response:
        body = await request.json()
        host = body.pop("host")
        known = self.by_host.get(host)
        self.by_host[host] = Engine(**body)
        if known is not None:
            self.by_host[host].requests, self.by_host[host].sent = known.requests, known.sent
            return web.json_response({"host": host, "replaced": True})
        app = web.Application()
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/is_sleeping", self.is_sleeping)
        app.router.add_get("/health", self.health)
        app.router.add_post("/sleep", self.sleep)
        app.router.add_post("/wake_up", self.wake_up)
        for path in INFERENCE:
            app.router.add_post(path, self.inference)
        # A client that leaves cancels its handler: a silent answer then ends.
        runner = web.AppRunner(
            app,
            handle_signals=False,
            access_log=None,
            shutdown_timeout=0.1,
            handler_cancellation=True,
        )
        await runner.setup()
        await web.TCPSite(runner, host, 8000, reuse_address=True).start()
        self.runners[host] = runner
        return web.json_response({"host": host, "replaced": False})

    async def inference(self, request: web.Request) -> web.StreamResponse:
        engine = self.engine(request)
        await request.read()
        if engine.answer == "silent":
            return await silent(request, engine)
        if engine.answer in ("huge", "endless"):
            return await completion(request, engine)
        return web.json_response({"error": {"message": "no answer"}}, status=404)

    async def report(self, _: web.Request) -> web.Response:
        return web.json_response({host: e.report() for host, e in self.by_host.items()})


TOLD = ("contradicts", "flips", "honest", "flaps")


def told_page(engine: Engine) -> str:
    """The `/metrics` page of the kinds that are told to sleep and wake (see the docstring)."""
    if engine.kind == "contradicts":
        asleep = True
    elif engine.kind == "flips":
        asleep = engine.scrapes % 2 == 0
    else:
        asleep = engine.asleep
    running = 1 if engine.kind == "flaps" and engine.scrapes % 2 else 0
    state = "weights_offloaded" if asleep else "awake"
    return (
        f"vllm:num_requests_running {running}\nvllm:num_requests_waiting 0\n"
        f'vllm:engine_sleep_state{{sleep_state="{state}"}} 1\n'
    )


async def huge(request: web.Request, engine: Engine) -> web.StreamResponse:
    head = GAUGES.encode()
    headers = {"Content-Type": "text/plain; version=0.0.4"}
    if engine.length:
        headers["Content-Length"] = str(engine.bytes)
    response = web.StreamResponse(headers=headers)
    await response.prepare(request)
    with engine.writing():
        left = engine.bytes
        block = head + BUCKETS * (CHUNK // len(BUCKETS))
        while left > 0:
            piece = block[:left]
            if len(piece) < len(block):  # the last: whole lines, padded with empty ones
                cut = piece.rfind(b"\n") + 1
                piece = piece[:cut] + b"\n" * (len(piece) - cut)
            await response.write(piece)
            engine.sent += len(piece)
            left -= len(piece)
            block = BUCKETS * (CHUNK // len(BUCKETS))
        await response.write_eof()
    return response


async def drip(request: web.Request, engine: Engine, body: bytes) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/plain; version=0.0.4"})
    await response.prepare(request)
    with engine.writing():
        index = 0
        while True:  # a valid page, over and over, never ended
            await response.write(body[index : index + 1])
            engine.sent += 1
            index = (index + 1) % len(body)
            await asyncio.sleep(engine.interval)
    return response


async def completion(request: web.Request, engine: Engine) -> web.StreamResponse:
    """A JSON completion of `engine.bytes` bytes (`huge`), or one without end (`endless`)."""
    head = b'{"id":"cmpl-huge","object":"text_completion","choices":[{"index":0,"text":"'
    tail = b'","finish_reason":"length"}]}'
    headers = {"Content-Type": "application/json"}
    endless = engine.answer == "endless"
    if engine.length and not endless:
        headers["Content-Length"] = str(engine.bytes)
    response = web.StreamResponse(headers=headers)
    await response.prepare(request)
    with engine.writing():
        await response.write(head)
        engine.sent += len(head)
        left = engine.bytes - len(head) - len(tail)
        block = b"a" * CHUNK
        while endless or left > 0:
            piece = block if endless else block[:left]
            await response.write(piece)
            engine.sent += len(piece)
            left -= len(piece)
        await response.write(tail)
        engine.sent += len(tail)
        await response.write_eof()
    return response


async def silent(request: web.Request, engine: Engine) -> web.StreamResponse:
    """Holds the request, answering nothing, until its client leaves (which cancels it)."""
    with engine.writing():
        await asyncio.Event().wait()
    return web.Response(status=503)


async def serve(control_port: int) -> None:
    engines = Engines()
    control = web.Application()
    control.router.add_post("/engines", engines.add)
    control.router.add_get("/engines", engines.report)
    runner = web.AppRunner(control, handle_signals=False, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", control_port).start()
    try:
        await asyncio.Event().wait()
    finally:
        for each in engines.runners.values():
            with contextlib.suppress(Exception):
                await each.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--control-port", type=int, required=True)
    args = parser.parse_args()
    raise_fd_limit()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.control_port))


if __name__ == "__main__":
    main()
