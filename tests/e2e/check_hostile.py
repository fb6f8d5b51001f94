"""Engines that answer `snooze check` as no engine should, each on an address of its own, served
from a thread of the test's: one that never answers, one whose /version never ends, one that
answers garbage, and ones that say they are vLLM or SGLang and then answer nothing else in time.
Each counts what it was asked; the `hostile` fixture serves them for one test."""

from __future__ import annotations

import asyncio
import collections
import socket
import threading
from collections.abc import Awaitable, Callable, Iterator

import pytest
from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
PORT = 8000


class Hostile:
    """The servers, in a loop of their own thread."""

    def __init__(self) -> None:
        self.seen: collections.Counter[str] = collections.Counter()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._runners: list[web.AppRunner] = []
        self._sockets: list[socket.socket] = []

    def _run(self, coro: Awaitable[None]) -> None:
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)  # type: ignore[arg-type]

    def silent(self, host: str) -> str:
        """Accepts connections (the kernel's backlog) and never reads nor answers."""
        listener = socket.socket()
        listener.bind((host, PORT))
        listener.listen(64)
        self._sockets.append(listener)
        return f"http://{host}:{PORT}"

    def serve(self, host: str, handler: Handler) -> str:
        async def start() -> None:
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", self._counted(handler))
            runner = web.AppRunner(app, shutdown_timeout=0.5)
            await runner.setup()
            await web.TCPSite(runner, host, PORT).start()
            self._runners.append(runner)

        self._run(start())
        return f"http://{host}:{PORT}"

    def _counted(self, handler: Handler) -> Handler:
        async def counted(request: web.Request) -> web.StreamResponse:
            self.seen[f"{request.host.split(':')[0]} {request.method} {request.path}"] += 1
            return await handler(request)

        return counted

    def asked(self, url: str) -> dict[str, int]:
        host = url.split("//")[1].split(":")[0]
        return {k.split(" ", 1)[1]: n for k, n in self.seen.items() if k.startswith(host + " ")}

    def close(self) -> None:
        async def stop() -> None:
            for runner in self._runners:
                await runner.cleanup()
            # Handlers still waiting for an hour: ended, not left to the loop's teardown.
            current = asyncio.current_task()
            for task in asyncio.all_tasks():
                if task is not current:
                    task.cancel()

        self._run(stop())
        for listener in self._sockets:
            listener.close()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@pytest.fixture(name="hostile")
def hostile_servers() -> Iterator[Hostile]:
    servers = Hostile()
    yield servers
    servers.close()


async def endless(request: web.Request) -> web.StreamResponse:
    """A 200 whose body never ends (a megabyte at a time)."""
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    await response.prepare(request)
    chunk = b'{"version": "' + b"9" * (1 << 20)
    try:
        while True:
            await response.write(chunk)
    except (ConnectionError, asyncio.CancelledError):
        return response


async def garbage(request: web.Request) -> web.StreamResponse:
    return web.Response(body=b"\x00\xff\xfe garbage \x1b[2J" * 50, status=200)


async def vllm_then_nothing(request: web.Request) -> web.StreamResponse:
    """Says it is vLLM 0.33.0; every other route hangs, or drips its answer a byte at a time."""
    if request.path == "/version":
        return web.json_response({"version": "0.33.0"})
    if request.path.startswith("/metrics"):
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        try:
            while True:
                await response.write(b"#")
                await asyncio.sleep(0.2)
        except (ConnectionError, asyncio.CancelledError):
            return response
    await asyncio.sleep(3600)
    return web.Response()


async def login_wall(request: web.Request) -> web.StreamResponse:
    """A proxy in front of something: a login page, 401, at every path."""
    page = "<html><body><h1>401 Authorization Required</h1></body></html>"
    return web.Response(text=page, status=401, content_type="text/html")


SGLANG_INFO = {
    "version": "0.5.23",
    "model_path": "m",
    "enable_memory_saver": True,
    "enable_metrics": True,
    "enable_weights_cpu_backup": True,
    "admin_api_key": None,
}


async def sglang_then_nothing(request: web.Request) -> web.StreamResponse:
    """Says it is SGLang 0.5.23 (no /version, as SGLang); /metrics drips its answer a byte at a
    time, and every other route hangs."""
    if request.path == "/version":
        return web.json_response({"detail": "Not Found"}, status=404)
    if request.path == "/server_info":
        return web.json_response(SGLANG_INFO)
    if request.path.startswith("/metrics"):
        return await vllm_then_nothing(request)
    await asyncio.sleep(3600)
    return web.Response()


async def sglang_without_end(request: web.Request) -> web.StreamResponse:
    """No /version; a /server_info without end."""
    if request.path == "/version":
        return web.json_response({"detail": "Not Found"}, status=404)
    return await endless(request)
