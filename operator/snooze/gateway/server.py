"""The gateway's aiohttp application: its routes, its connections, and its life: start,
watch, drain on SIGTERM (not ready, no new connections, requests under way finish within a
grace period), stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

from snooze.api.listening import CannotListen
from snooze.gateway.bounds.connection import GatewayConnection
from snooze.gateway.bounds.stalls import Stalls
from snooze.gateway.errors import error_response
from snooze.gateway.metrics import GatewayMetrics
from snooze.gateway.models.hold import Holds
from snooze.gateway.models.registry import MODELS, PODS, Registry
from snooze.gateway.models.wake import WakeRequests
from snooze.gateway.models.watch import follow
from snooze.gateway.request import paths
from snooze.gateway.request.body import BodyBudget, Parser
from snooze.gateway.request.inference import Inference, unknown_model
from snooze.gateway.request.router import Router
from snooze.gateway.settings import GatewaySettings
from snooze.kube.api import KubeApi

log = logging.getLogger(__name__)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Gateway:
    """One gateway replica: its registry, holds and router, served by an aiohttp runner."""

    def __init__(
        self,
        settings: GatewaySettings,
        api: KubeApi,
        metrics: GatewayMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.api = api
        self.metrics = metrics or GatewayMetrics()
        scopes: list[str | None] = list(settings.namespaces) or [None]
        self.scopes = scopes
        self.router = Router()
        self.stalls = Stalls(bound=settings.upstream_start_timeout, metrics=self.metrics)
        self.registry = Registry(
            scopes=scopes,
            on_pod_gone=self._pod_gone,
            on_model_gone=self.router.forget,
            # The operator relabelled it (found asleep, woken, ...): judged afresh from here.
            on_pod_relabelled=self.stalls.pardon,
        )
        self.wakes = WakeRequests(
            api=api,
            registry=self.registry,
            metrics=self.metrics,
            bound=settings.wake_request_timeout,
            recent=settings.wake_recent_seconds,
        )
        self.holds = Holds(
            registry=self.registry, wakes=self.wakes, max_held=settings.max_held_per_model
        )
        self.bodies = BodyBudget(settings.max_buffered_body_bytes)
        self.parser = Parser()
        self.inference = Inference(
            settings=settings,
            registry=self.registry,
            holds=self.holds,
            wakes=self.wakes,
            router=self.router,
            metrics=self.metrics,
            bodies=self.bodies,
            parser=self.parser,
            session=self._session_or_fail,
            stalls=self.stalls,
        )
        self.draining = False
        """SIGTERM was received: not ready, no new work, what is under way finishes."""
        self.active = 0
        """Requests being handled now, of any route."""
        self._idle = asyncio.Event()
        self._idle.set()
        self._tasks: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self._listener: asyncio.Server | None = None
        self.port = settings.port

    @property
    def held_seconds(self) -> list[float]:
        return self.inference.held_seconds

    def app(self) -> web.Application:
        app = web.Application(
            client_max_size=self.settings.max_body_bytes, middlewares=[self._guard]
        )
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/v1/models", self.list_models)
        app.router.add_get("/v1/models/{name:.+}", self.get_model)
        for path in paths.INFERENCE_PATHS:
            app.router.add_post(path, self.inference.handle)
        return app

    async def start(self) -> None:
        # No read timeout: a long generation may pause between tokens for as long as it likes.
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.settings.connect_timeout)
        self._session = aiohttp.ClientSession(
            timeout=timeout,
            auto_decompress=False,
            connector=aiohttp.TCPConnector(limit=0, force_close=False),
        )
        for scope in self.scopes:
            for kind in (MODELS, PODS):
                coro = follow(
                    self.api,
                    self.registry,
                    kind=kind,
                    scope=scope,
                    watch_seconds=self.settings.watch_seconds,
                )
                self._tasks.append(asyncio.create_task(coro, name=f"watch-{kind}-{scope}"))
        # handler_cancellation: a client that leaves cancels its handler, so a held request
        # gives up its place in the queue at once.
        self._runner = web.AppRunner(
            self.app(), handler_cancellation=True, access_log=None, shutdown_timeout=1.0
        )
        await self._runner.setup()
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()

        def connection() -> GatewayConnection:
            return GatewayConnection(
                server,
                loop=loop,
                head_timeout=self.settings.client_header_timeout,
                access_log=None,
                auto_decompress=False,  # request/body.py decodes, within the body limit
            )

        try:
            self._listener = await loop.create_server(
                connection, self.settings.host, self.settings.port, reuse_address=True, backlog=512
            )
        except OSError as exc:
            raise CannotListen(self.settings.host, self.settings.port, exc) from exc
        self.port = int(self._listener.sockets[0].getsockname()[1])
        log.info("gateway listening on %s:%d", self.settings.host, self.port)

    async def stop(self) -> None:
        if self._listener is not None:
            self._listener.close()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()
        await self.api.aclose()
        self.parser.close()

    async def drain(self, grace: float) -> None:
        """Stop taking work and let what is under way finish, for at most `grace` seconds;
        then release held requests (503, retry elsewhere). `stop` ends the rest."""
        self.draining = True
        if self._listener is not None:
            self._listener.close()  # new connections are refused from now on
        log.info("draining: %d requests under way, %gs to finish", self.active, grace)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), grace)
        if self.active:
            log.warning("%d requests still under way after the grace period", self.active)
            self.holds.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), 1.0)

    def _pod_gone(self, namespace: str, pod: str) -> None:
        self.metrics.pod_gone(namespace, pod)
        self.stalls.forget(namespace, pod)

    def _session_or_fail(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("the gateway is not started")
        return self._session

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Every request: counted (for the drain), its connection told when it runs, its
        target checked, and refused while draining if it would start new work."""
        connection = request.protocol if isinstance(request.protocol, GatewayConnection) else None
        if connection is not None:
            connection.request_began()
        self.active += 1
        self._idle.clear()
        reusable = False
        try:
            if self.draining and request.path in paths.INFERENCE_PATHS:
                response: web.StreamResponse = error_response(
                    503,
                    "this gateway replica is shutting down; retry, another one will answer",
                    code="shutting_down",
                    headers={"Retry-After": "1"},
                )
                # Counted here: the request never reaches the inference handler, which
                # counts every other answer.
                self.metrics.request_done("", "", 503, 0.0)
                self.metrics.rejected("shutting_down")
            else:
                response = await _checked(request, handler)
            if self.draining and not response.prepared:
                response.force_close()  # the client reconnects, to another replica
            reusable = response.keep_alive is not False and request.content.is_eof()
            return response
        finally:
            self.active -= 1
            if not self.active:
                self._idle.set()
            if connection is not None:
                connection.request_ended(reusable=reusable)

    # --- routes ---------------------------------------------------------------------------

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(self, request: web.Request) -> web.Response:
        if self.draining:
            return web.json_response({"status": "shutting down"}, status=503)
        if self.registry.ready:
            return web.json_response({"status": "ready"})
        return web.json_response({"status": "listing models and pods"}, status=503)

    def describe(self, name: str) -> dict[str, Any]:
        """A model name in OpenAI's shape, with Snooze's view of it under `snooze` when the
        gateway runs with --expose-model-status."""
        claim = self.registry.resolve(name)
        holder = claim.holder
        view: dict[str, Any]
        if holder is not None:
            view = {
                "phase": holder.phase,
                "awake": len(self.registry.awake_pods(holder)),
                "pods": len(self.registry.pods_of(holder)),
                "namespace": holder.namespace,
                "name": holder.name,
            }
        else:
            phase = "NameConflict" if claim.claimants > 1 else "Pending"
            view = {"phase": phase, "awake": 0, "pods": 0, "namespace": None, "name": None}
        described: dict[str, Any] = {
            "id": name,
            "object": "model",
            "created": 0,
            "owned_by": "snooze",
        }
        if self.settings.expose_model_status:
            described["snooze"] = view
        return described

    async def list_models(self, request: web.Request) -> web.Response:
        data = [self.describe(name) for name in self.registry.names()]
        return web.json_response({"object": "list", "data": data})

    async def get_model(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if not self.registry.resolve(name).named:
            return unknown_model(name)
        return web.json_response(self.describe(name))


async def _checked(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuse a request target with a second spelling; answer unknown routes in OpenAI's shape."""
    why = paths.refusal(request.raw_path)
    if why is not None:
        return error_response(400, f"{why}; the gateway serves {', '.join(paths.INFERENCE_PATHS)}")
    try:
        return await handler(request)
    except web.HTTPMethodNotAllowed as exc:
        return error_response(
            405,
            f"{request.method} is not allowed on {request.path}; use "
            f"{', '.join(sorted(exc.allowed_methods))}",
            code="method_not_allowed",
            headers={"Allow": ",".join(sorted(exc.allowed_methods))},
        )
    except web.HTTPNotFound:
        return error_response(
            404,
            f"no route {request.path}: the gateway serves GET /v1/models and POST "
            f"{', '.join(paths.INFERENCE_PATHS)}",
            code="unknown_route",
        )


async def serve(
    settings: GatewaySettings,
    stop: asyncio.Event | None = None,
    metrics: GatewayMetrics | None = None,
) -> None:
    """Run a gateway until `stop` is set (or forever), logged in as kopf would; then drain it
    for `settings.shutdown_grace_seconds` and stop."""
    gateway = Gateway(settings, KubeApi.from_environment(), metrics)
    try:
        await gateway.start()
        await (stop or asyncio.Event()).wait()
        await gateway.drain(settings.shutdown_grace_seconds)
    finally:
        await gateway.stop()
