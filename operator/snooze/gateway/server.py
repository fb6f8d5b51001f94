"""The gateway's aiohttp application: OpenAI routes, health, and its life (watchers, sessions)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web
from yarl import URL

from snooze.gateway import paths, proxy
from snooze.gateway.body import BodyBudget, Parser, Reservation, read_body
from snooze.gateway.connection import GatewayConnection
from snooze.gateway.errors import REASONS, REJECTED, error_response, sse_error
from snooze.gateway.hold import Holds, Outcome, Waited
from snooze.gateway.metrics import GatewayMetrics
from snooze.gateway.model import Model
from snooze.gateway.registry import MODELS, PODS, Claim, Registry
from snooze.gateway.router import Router
from snooze.gateway.settings import GatewaySettings
from snooze.gateway.wake import WakeRequestFailed, WakeRequests
from snooze.gateway.watch import follow
from snooze.kube.api import KubeApi

log = logging.getLogger(__name__)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
HELD_HEADER = "x-snooze-held-seconds"


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
        self.registry = Registry(scopes=scopes)
        self.holds = Holds(registry=self.registry, max_held=settings.max_held_per_model)
        self.wakes = WakeRequests(
            api=api,
            registry=self.registry,
            metrics=self.metrics,
            bound=settings.wake_request_timeout,
            recent=settings.wake_recent_seconds,
        )
        self.router = Router()
        self.bounds = proxy.Bounds(
            first_byte=settings.upstream_first_byte_timeout, idle=settings.upstream_idle_timeout
        )
        self.bodies = BodyBudget(settings.max_buffered_body_bytes)
        self.parser = Parser()
        self.held_seconds: list[float] = []
        """How long each held request waited, for tests and benchmarks."""
        self._tasks: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self._listener: asyncio.Server | None = None
        self.port = settings.port

    def app(self) -> web.Application:
        app = web.Application(
            client_max_size=self.settings.max_body_bytes, middlewares=[checked_target]
        )
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/v1/models", self.list_models)
        app.router.add_get("/v1/models/{name:.+}", self.get_model)
        for path in paths.INFERENCE_PATHS:
            app.router.add_post(path, self.inference)
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
                auto_decompress=False,  # body.py decodes, within the body limit
            )

        self._listener = await loop.create_server(
            connection, self.settings.host, self.settings.port, reuse_address=True, backlog=512
        )
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

    # --- routes ---------------------------------------------------------------------------

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(self, request: web.Request) -> web.Response:
        if self.registry.ready:
            return web.json_response({"status": "ready"})
        return web.json_response({"status": "listing models and pods"}, status=503)

    def describe(self, name: str) -> dict[str, Any]:
        """A model name in OpenAI's shape, with Snooze's view of it under `snooze`."""
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
        return {
            "id": name,
            "object": "model",
            "created": 0,
            "owned_by": "snooze",
            "snooze": view,
        }

    async def list_models(self, request: web.Request) -> web.Response:
        data = [self.describe(name) for name in self.registry.names()]
        return web.json_response({"object": "list", "data": data})

    async def get_model(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if not self.registry.resolve(name).named:
            return _unknown(name)
        return web.json_response(self.describe(name))

    async def inference(self, request: web.Request) -> web.StreamResponse:
        begun = time.monotonic()
        labels: list[str] = ["", ""]  # namespace and InferenceModel name, once known
        hold = Reservation(self.bodies)
        try:
            response = await self._inference(request, labels, hold)
        finally:
            hold.release()
        namespace, model = labels
        self.metrics.request_done(namespace, model, response.status, time.monotonic() - begun)
        reason = response.get(REJECTED)
        if reason is not None:
            self.metrics.rejected(reason, namespace=namespace, model=model)
        return response

    async def _inference(
        self, request: web.Request, labels: list[str], hold: Reservation
    ) -> web.StreamResponse:
        raw = await read_body(
            request,
            limit=self.settings.max_body_bytes,
            seconds=self.settings.client_body_timeout,
            hold=hold,
        )
        if isinstance(raw, web.Response):
            return raw
        parsed = await self.parser.parse(raw)
        if isinstance(parsed, web.Response):
            return parsed
        name, stream = parsed
        if not self.registry.ready:
            return error_response(
                503,
                "the gateway is still loading the list of models; retry in a moment",
                code="not_ready",
                headers={"Retry-After": "1"},
            )
        claim = self.registry.resolve(name)
        if claim.holder is None:
            return _unserved(name, claim)
        model = claim.holder
        labels[:] = [model.namespace, model.name]
        started: web.StreamResponse | None = None
        held = 0.0
        if not self.registry.awake_pods(model):
            result = await self._hold(request, model, name, stream)
            if not isinstance(result, Held):
                return result
            started, held = result.stream, result.seconds
            model = self.registry.get(model.key) or model  # its spec may have changed meanwhile
        return await self._forward(request, model, name, raw, started, held)

    async def _hold(
        self, request: web.Request, model: Model, name: str, stream: bool
    ) -> web.StreamResponse | Held:
        refusal = model.refusal()
        if refusal is not None:
            return error_response(503, refusal, code="model_asleep")
        assert model.spec is not None  # refusal() said so
        if not self.holds.enter(model):
            retry = max(1, math.ceil(model.last_wake_seconds or 5.0))
            return error_response(
                429,
                f"too many requests are waiting for model {model.model_name!r} to wake "
                f"(limit {self.holds.max_held}); retry in {retry}s",
                code="wake_queue_full",
                headers={"Retry-After": str(retry)},
            )
        begun = time.monotonic()
        response: web.StreamResponse | None = None
        try:
            with self.metrics.held(model.namespace, model.name):
                try:
                    asked_at = await self.wakes.ensure(model)
                except WakeRequestFailed as exc:
                    return error_response(
                        503,
                        str(exc),
                        code="wake_request_failed",
                        headers={"Retry-After": str(math.ceil(exc.retry_after))},
                    )
                if stream:
                    # Begin the SSE now, so that clients and proxies see life while it wakes.
                    response = web.StreamResponse(
                        status=200,
                        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"},
                    )
                    await response.prepare(request)
                comment = f": waiting for model {model.model_name} to wake\n\n".encode()

                async def keepalive() -> None:
                    if response is not None:
                        await response.write(comment)

                waited = await self.holds.wait_awake(
                    model,
                    name=name,
                    asked_at=asked_at,
                    deadline=begun + model.hold_seconds(),
                    tick=self.settings.keepalive_seconds,
                    on_tick=keepalive if response is not None else None,
                )
        finally:
            self.holds.leave(model)
        seconds = time.monotonic() - begun
        if waited.outcome is Outcome.AWAKE:
            self.held_seconds.append(seconds)
            log.info("held a request for %s for %.3fs", model.model_name, seconds)
            if response is not None:
                await response.write(f": held {seconds:.3f}s while the model woke\n\n".encode())
            return Held(stream=response, seconds=seconds)
        retry = self._retry_after(model, asked_at)
        status, message, code = _failure(model, waited, retry)
        if response is None:
            headers = {"Retry-After": str(retry)} if status == 503 else None
            return error_response(status, message, code=code, headers=headers)
        await response.write(sse_error(status, message, code=code))
        await response.write_eof()
        response[REJECTED] = REASONS[status]
        return response

    def _retry_after(self, model: Model, asked_at: float | None) -> int:
        """Seconds until the wake request a request waited on lapses, and a new request would
        ask again (at least 1)."""
        if asked_at is None or model.spec is None:
            return 1
        lapses = asked_at + max(model.hold_seconds(), self.settings.wake_recent_seconds)
        return max(1, math.ceil(lapses - time.time()))

    async def _forward(
        self,
        request: web.Request,
        model: Model,
        name: str,
        body: bytes,
        started: web.StreamResponse | None,
        held: float,
    ) -> web.StreamResponse:
        assert model.spec is not None
        tried: set[str] = set()
        extra = {HELD_HEADER: f"{held:.3f}"}
        while True:
            current = self.registry.get(model.key)
            awake = self.registry.awake_pods(current) if current and current.holds(name) else []
            candidates = [p for p in awake if p.name not in tried]
            pod = self.router.choose(candidates)
            if pod is None:
                message = (
                    f"no awake pod of model {model.model_name!r} could be reached"
                    + (f" (tried {', '.join(sorted(tried))})" if tried else "")
                    + "; retry shortly"
                )
                if started is None:
                    return error_response(502, message, code="no_pod_reachable")
                await started.write(sse_error(502, message, code="no_pod_reachable"))
                await started.write_eof()
                started[REJECTED] = REASONS[502]
                return started
            # Built from parts, the path from the allowlist: never the client's own string.
            url = URL.build(
                scheme=model.spec.engine.scheme,
                host=pod.ip or "",
                port=model.spec.engine.port,
                path=_allowed_path(request),
                query=request.query,
            )
            with self.router.track(pod):
                try:
                    return await proxy.forward(
                        self._session_or_fail(),
                        request,
                        url=url,
                        body=body,
                        started=started,
                        extra_headers=extra,
                        pod_name=pod.name,
                        bounds=self.bounds,
                    )
                except proxy.ConnectFailed as exc:
                    log.warning("%s; trying another pod", exc)
                    tried.add(pod.name)
                    self.router.unreachable(pod)

    def _session_or_fail(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("the gateway is not started")
        return self._session


@web.middleware
async def checked_target(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuse a request target with a second spelling; answer unknown routes in OpenAI's shape."""
    connection = request.protocol
    if not isinstance(connection, GatewayConnection):
        return await _checked(request, handler)
    connection.request_began()
    reusable = False
    try:
        response = await _checked(request, handler)
        reusable = response.keep_alive is not False and request.content.is_eof()
        return response
    finally:
        connection.request_ended(reusable=reusable)


async def _checked(request: web.Request, handler: Handler) -> web.StreamResponse:
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


def _allowed_path(request: web.Request) -> str:
    """The allowlisted path the request was routed by (its resource's own, not the client's)."""
    resource = request.match_info.route.resource
    path = resource.canonical if resource is not None else ""
    if path not in paths.INFERENCE_PATHS:
        raise RuntimeError(f"{path!r} is not an inference route")  # unreachable by routing
    return path


@dataclass(frozen=True, kw_only=True)
class Held:
    """A request held until its model woke: the SSE begun early (if streaming), and the wait."""

    stream: web.StreamResponse | None
    seconds: float


def _unknown(name: str) -> web.Response:
    return error_response(
        404,
        f"The model `{name}` does not exist; GET /v1/models lists the models served here.",
        param="model",
        code="model_not_found",
    )


def _unserved(name: str, claim: Claim) -> web.Response:
    """No model holds `name`: unknown (404), claimed by several (503), or not yet claimed."""
    if not claim.named:
        return _unknown(name)
    if claim.claimants > 1:
        # Never the namespaces: they belong to other tenants. The cluster's admin can look.
        message = (
            f"the model name {name!r} is claimed by {claim.claimants} models and the operator "
            "has not yet settled which one holds it; retry shortly, or ask an administrator "
            "to run `kubectl get inferencemodels.snooze.dev -A`"
        )
        code = "model_name_conflict"
    else:
        message = (
            f"model {name!r} is not yet served by the operator (no InferenceModel's status "
            "claims that name yet); retry shortly"
        )
        code = "model_not_ready"
    return error_response(503, message, code=code, headers={"Retry-After": "2"})


def _failure(model: Model, waited: Waited, retry: int) -> tuple[int, str, str]:
    """Status, message and code for a held request whose wait ended without an awake pod."""
    outcome = waited.outcome
    if outcome is Outcome.TIMEOUT:
        limit = model.hold_limit_name() if model.spec else "wake timeout"
        return (
            504,
            f"model {model.model_name!r} did not wake within its {limit}; "
            "kubectl describe inferencemodel shows why",
            "wake_timeout",
        )
    if outcome is Outcome.FAILED and waited.failure is not None:
        failure = waited.failure
        return (
            503,
            f"model {model.model_name!r} failed to wake ({failure.reason}): {failure.message}. "
            "The operator reported it and will not retry this wake (wake.onFailure: Report); "
            f"kubectl describe inferencemodel shows more. Retry in {retry}s",
            "wake_failed",
        )
    if outcome is Outcome.GONE:
        return 404, f"model {model.model_name!r} was deleted while waiting", "model_not_found"
    if outcome is Outcome.UNCLAIMED:
        return (
            503,
            f"the model that served {model.model_name!r} no longer holds that name; retry",
            "model_name_conflict",
        )
    current = model.refusal() or "the model may no longer be woken on request"
    return 503, current, "model_asleep"


async def serve(
    settings: GatewaySettings,
    stop: asyncio.Event | None = None,
    metrics: GatewayMetrics | None = None,
) -> None:
    """Run a gateway until `stop` is set (or forever), logged in as kopf would."""
    gateway = Gateway(settings, KubeApi.from_environment(), metrics)
    await gateway.start()
    try:
        await (stop or asyncio.Event()).wait()
    finally:
        await gateway.stop()
