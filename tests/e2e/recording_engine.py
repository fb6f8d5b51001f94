"""An engine stand-in that records every request exactly as it arrived: the header lines as
sent (repeats included) and the body undecoded, for tests that assert on what an engine
received. It answers every request with a small completion."""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass

from aiohttp import web


@dataclass(frozen=True)
class Received:
    method: str
    path: str
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k.lower() == name.lower()]


ANSWER = {
    "id": "cmpl-recorded",
    "object": "text_completion",
    "model": "recorded",
    "choices": [{"index": 0, "text": "ok", "finish_reason": "stop"}],
}


class RecordingEngine:
    """Listens on host:8000 from a thread of its own; `received` lists what came in."""

    def __init__(self, host: str, port: int = 8000) -> None:
        self.host = host
        self.port = port
        self.received: list[Received] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.ServerRunner | None = None

    async def _handle(self, request: web.BaseRequest) -> web.Response:
        body = await request.read()
        headers = [(k.decode(), v.decode()) for k, v in request.raw_headers]
        self.received.append(Received(request.method, request.path, headers, body))
        return web.json_response(ANSWER)

    async def _start(self) -> None:
        # auto_decompress off: the body is kept as it was sent, encoded or not.
        server = web.Server(self._handle, auto_decompress=False)
        self._runner = web.ServerRunner(server, shutdown_timeout=0.1)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()

    def start(self) -> RecordingEngine:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def json_bodies(self) -> list[object]:
        return [json.loads(r.body) for r in self.received]
