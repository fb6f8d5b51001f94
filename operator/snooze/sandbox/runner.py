"""Serve the emulator over HTTP: in a thread of its own (for sync code) or in the caller's loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from pathlib import Path
from types import TracebackType
from typing import Self

import aiohttp.web
import yaml

from snooze.sandbox.emulator import SandboxEmulator

CONTEXT = "snooze-sandbox"


def kubeconfig(url: str) -> dict[str, object]:
    """A kubeconfig that points at the sandbox: one cluster, user and context; pure."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CONTEXT, "cluster": {"server": url}}],
        "users": [{"name": CONTEXT, "user": {"token": "sandbox"}}],
        "contexts": [
            {
                "name": CONTEXT,
                "context": {
                    "cluster": CONTEXT,
                    "user": CONTEXT,
                    "namespace": "default",
                },
            }
        ],
        "current-context": CONTEXT,
        "preferences": {},
    }


class Sandbox:
    """A Kubernetes API emulator on a local port, for tests, demos and `snooze sandbox`."""

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self.port = port
        self.emulator = SandboxEmulator()
        self._runner: aiohttp.web.ServerRunner | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped: asyncio.Event | None = None

    @property
    def url(self) -> str:
        if self._runner is None:
            raise RuntimeError("The sandbox is not serving yet: call start() or serve() first.")
        return f"http://{self.host}:{self.port}"

    # -- In the caller's event loop --------------------------------------------------------------

    async def serve(self) -> None:
        """Start serving in the running loop; returns once the port is bound (OSError if taken)."""
        await self.emulator.__aenter__()
        server = aiohttp.web.Server(self.emulator)
        # A short grace: watch streams are ended explicitly in aclose(), nothing else lingers.
        runner = aiohttp.web.ServerRunner(server, handle_signals=False, shutdown_timeout=0.5)
        await runner.setup()
        site = aiohttp.web.TCPSite(runner, self.host, self.port)
        try:
            await site.start()
        except OSError:
            await runner.cleanup()
            await self.emulator.__aexit__(None, None, None)
            raise
        self.port = int(runner.addresses[0][1])
        self._runner = runner

    async def aclose(self) -> None:
        if self._runner is not None:
            self.emulator.close_watches()
            await self._runner.cleanup()
            self._runner = None
            await self.emulator.__aexit__(None, None, None)

    async def __aenter__(self) -> Self:
        await self.serve()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- In a thread of its own ------------------------------------------------------------------

    def start(self) -> Self:
        """Serve from a daemon thread with its own loop; returns once serving (raises OSError)."""
        ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=self._thread_main, args=(ready,), name="snooze-sandbox", daemon=True
        )
        self._thread.start()
        ready.result()
        return self

    def _thread_main(self, ready: concurrent.futures.Future[None]) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stopped = asyncio.Event()
            try:
                await self.serve()
            except BaseException as exc:
                ready.set_exception(exc)
                return
            ready.set_result(None)
            await self._stopped.wait()
            await self.aclose()

        asyncio.run(main())

    def stop(self) -> None:
        if self._loop is not None and self._stopped is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._stopped.set)
            self._thread.join(timeout=10)
            self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- Seams for tests and benchmarks ----------------------------------------------------------

    def write_kubeconfig(self, path: str | os.PathLike[str]) -> Path:
        target = Path(path)
        target.write_text(yaml.safe_dump(kubeconfig(self.url), sort_keys=False))
        return target

    def inject_fault(
        self,
        *,
        method: str | None = None,
        path_contains: str = "",
        status: int = 500,
        times: int = 1,
        message: str | None = None,
    ) -> None:
        """Answer the next `times` matching requests with a Status error of code `status`."""
        self.emulator.inject_fault(
            method=method,
            path_contains=path_contains,
            status=status,
            times=times,
            message=message or f"injected fault: HTTP {status} by the snooze sandbox",
        )

    def accept_tokens(self, *tokens: str) -> None:
        """From now on, answer 401 to requests without one of these bearer tokens (none given:
        accept every request again, as by default)."""
        self.emulator.tokens.accept(frozenset(tokens) if tokens else None)

    def tokens_seen(self) -> dict[str, int]:
        """Requests per bearer token sent ("" for none), counted since the start."""
        return self.emulator.tokens.counts()

    def requests_count(self, method: str | None = None, path_contains: str = "") -> int:
        """How many requests were answered (all, or of one HTTP method, or those whose path and
        query hold `path_contains`), faults included."""
        return self.emulator.requests_count(method, path_contains)

    def writes_count(self, namespace: str) -> int:
        """How many writes (POST, PUT, PATCH, DELETE) to objects in `namespace` were answered
        ("" for cluster-wide objects): what a tenant's models cost the API server."""
        return self.emulator.writes_count(namespace)
