"""One inference request, from its body to the engine's answer: read it, find the model that
holds its name, hold it while that model wakes, forward it to an awake pod.

Choices a user can observe:
- A request waits for a wake only when no pod is routable (Ready, labelled `awake`, and
  listed awake on the model's status); it then costs at most one wake annotation per wake,
  per replica (models/wake.py).
- The wait shows: non-streaming answers carry `x-snooze-held-seconds`; a streaming request
  gets its 200 at once, `: waiting for model X to wake` comments every `--keepalive-seconds`,
  then `: held N.NNNs while the model woke` before the engine's first event.
- Every error the gateway makes itself is in OpenAI's shape; after an SSE has begun, an error
  is a final `data: {"error": ...}` event, which OpenAI's clients raise.
- Only requests not yet sent are retried on another pod; such a pod is avoided for a few
  seconds, since its awake label outlives it until the operator notices.
"""

from __future__ import annotations

import functools
import logging
import math
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from yarl import URL

from snooze.api.conditions import ConditionReason
from snooze.gateway.bounds import stalls as stalls_
from snooze.gateway.bounds.clients import ClientStalled, ClientWatches, abandon, bounded_write
from snooze.gateway.bounds.deadlines import Bounds
from snooze.gateway.bounds.stalls import PROBE_PATH, PROBED_PATHS, Probe, Stalls, probe_engine
from snooze.gateway.errors import REASONS, REJECTED, error_response, sse_error
from snooze.gateway.metrics import GatewayMetrics
from snooze.gateway.models.hold import Holds, Outcome, Waited, nothing_to_wake
from snooze.gateway.models.model import Model
from snooze.gateway.models.registry import Claim, Registry
from snooze.gateway.models.wake import WakeRequestFailed, WakeRequests
from snooze.gateway.models.watch import CRD_CHECK_SECONDS
from snooze.gateway.request import paths, proxy
from snooze.gateway.request.body import BodyBudget, Parser, Reservation, read_body
from snooze.gateway.request.router import Router
from snooze.gateway.settings import GatewaySettings

log = logging.getLogger(__name__)
# How long a request that comes before the first lists of models and pods waits for them;
# beyond it, a 503 with Retry-After (the CRD may not be installed at all).
LOADING_WAIT_SECONDS = 10.0
HELD_HEADER = "x-snooze-held-seconds"
# A model with no engine to wake: nothing comes until someone starts its pods, which then take
# at least this long to be scheduled and load.
NO_ENGINES_RETRY_SECONDS = 10
NO_ENGINES = "model_has_no_engines"


class Inference:
    """Serves the inference routes; the parts it uses belong to the Gateway."""

    def __init__(
        self,
        *,
        settings: GatewaySettings,
        registry: Registry,
        holds: Holds,
        wakes: WakeRequests,
        router: Router,
        metrics: GatewayMetrics,
        bodies: BodyBudget,
        parser: Parser,
        session: Callable[[], aiohttp.ClientSession],
        stalls: Stalls,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.holds = holds
        self.wakes = wakes
        self.router = router
        self.metrics = metrics
        self.bodies = bodies
        self.parser = parser
        self.session = session
        self.stalls = stalls
        self.bounds = Bounds(
            first_byte=settings.upstream_first_byte_timeout,
            idle=settings.upstream_idle_timeout,
            client_read=settings.client_read_timeout,
        )
        self.clients = ClientWatches(settings.client_read_timeout)
        self.held_seconds: list[float] = []
        """How long each held request waited, for tests and benchmarks."""

    async def handle(self, request: web.Request) -> web.StreamResponse:
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
            await self._wait_loaded()
        if not self.registry.ready:
            return error_response(
                503,
                "no model is served yet: the InferenceModel CRD is not installed in the "
                "cluster (kubectl apply -f crds/)"
                if self.registry.crd_missing
                else "the gateway is still loading the list of models; retry in a moment",
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
        return await self._forward(request, model, name, raw, started, held, stream=stream)

    async def _wait_loaded(self) -> None:
        """A request that comes while the gateway lists models and pods (it has just started,
        or the CRD was just installed) waits for the lists, up to LOADING_WAIT_SECONDS; while
        the CRD is missing, up to three of the gateway's looks for it."""
        begun = time.monotonic()
        while not self.registry.ready:
            limit = 3 * CRD_CHECK_SECONDS if self.registry.crd_missing else LOADING_WAIT_SECONDS
            left = begun + limit - time.monotonic()
            if left <= 0:
                return
            await self.registry.wait_change(left)

    async def _hold(
        self, request: web.Request, model: Model, name: str, stream: bool
    ) -> web.StreamResponse | Held:
        refusal = model.refusal()
        if refusal is not None:
            return error_response(503, refusal, code="model_asleep")
        pods, coming_back = self.registry.pods_of(model), self.registry.coming_back(model)
        if nothing_to_wake(model, pods, coming_back=coming_back):
            return error_response(
                503,
                no_engines(model, name_it=self.settings.expose_model_status),
                code=NO_ENGINES,
                headers={"Retry-After": str(NO_ENGINES_RETRY_SECONDS)},
            )
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

                async def keepalive() -> None:
                    # What it waits for now: a wake, or room on its GPU pool (the operator says
                    # so on the model's status while its pool makes room).
                    current = self.registry.get(model.key) or model
                    if current.waiting_for_room is not None:
                        text = f"{current.model_name}: {current.waiting_for_room}"
                    else:
                        text = f"waiting for model {current.model_name} to wake"
                    if response is not None:
                        comment = f": {_one_line(text)}\n\n".encode()
                        await bounded_write(response, comment, self.bounds.client_read)

                try:
                    waited = await self.holds.wait_awake(
                        model,
                        name=name,
                        asked_at=asked_at,
                        deadline=begun + model.hold_seconds(),
                        tick=self.settings.keepalive_seconds,
                        on_tick=keepalive if response is not None else None,
                    )
                except ClientStalled:
                    assert response is not None  # only a stream's comments are written
                    return abandon(request, response)
        finally:
            self.holds.leave(model)
        seconds = time.monotonic() - begun
        if waited.outcome is Outcome.AWAKE:
            self.held_seconds.append(seconds)
            log.info("held a request for %s for %.3fs", model.model_name, seconds)
            if response is not None:
                comment = f": held {seconds:.3f}s while the model woke\n\n".encode()
                try:
                    await bounded_write(response, comment, self.bounds.client_read)
                except ClientStalled:
                    return abandon(request, response)
            return Held(stream=response, seconds=seconds)
        # After a known failure, retrying helps once the wake request lapses; otherwise soon.
        retry = 1
        if waited.outcome is Outcome.FAILED:
            retry = self._retry_after(model, waited.asked_at)
        elif waited.not_asked is not None:
            retry = math.ceil(waited.not_asked.retry_after)
        elif waited.outcome is Outcome.NO_ENGINES:
            retry = NO_ENGINES_RETRY_SECONDS
        status, message, code = _failure(
            model, waited, retry, name_it=self.settings.expose_model_status
        )
        reason = "shutting_down" if code == "shutting_down" else REASONS[status]
        headers = {"Retry-After": str(retry)} if status == 503 else None
        return await self._refuse(
            request, response, status, message, code, reason=reason, headers=headers
        )

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
        *,
        stream: bool,
    ) -> web.StreamResponse:
        assert model.spec is not None
        tried: set[str] = set()
        extra = {HELD_HEADER: f"{held:.3f}"}
        while True:
            current = self.registry.get(model.key)
            awake = self.registry.awake_pods(current) if current and current.holds(name) else []
            untried = [p for p in awake if p.name not in tried]
            # An engine found stuck gets nothing for a while: the operator's view that it is
            # awake stands, but this replica saw it start nothing.
            avoided = {p.name: self.stalls.avoided((p.namespace, p.name)) for p in untried}
            candidates = [p for p in untried if not avoided[p.name]]
            pod = self.router.choose(candidates, model.key)
            if pod is None:
                stuck = {n: s for n, s in avoided.items() if s}
                if stuck:
                    return await self._all_stuck(request, model, stuck, started)
                message = (
                    f"no awake pod of model {model.model_name!r} could be reached"
                    + (f" (tried {', '.join(sorted(tried))})" if tried else "")
                    + "; retry shortly"
                )
                return await self._refuse(request, started, 502, message, "no_pod_reachable")
            # Built from parts, the path from the allowlist: never the client's own string.
            path = _allowed_path(request)
            url = URL.build(
                scheme=model.spec.engine.scheme,
                host=pod.ip or "",
                port=model.spec.engine.port,
                path=path,
                query=request.query,
            )
            probe: Probe | None = None
            if path in PROBED_PATHS:
                probe = functools.partial(
                    probe_engine,
                    self.session(),
                    url.with_path(PROBE_PATH).with_query(None),
                    name,
                    request.headers.get("Authorization"),
                )
            watch = self.stalls.waiting(
                (pod.namespace, pod.name), stream=stream or started is not None, probe=probe
            )
            with (
                self.router.track(pod),
                self.metrics.sending(pod.namespace, pod.name) as sending,
            ):
                try:
                    return await proxy.forward(
                        self.session(),
                        request,
                        url=url,
                        body=body,
                        started=started,
                        extra_headers=extra,
                        pod_name=pod.name,
                        bounds=self.bounds,
                        watch=watch,
                        clients=self.clients,
                    )
                except proxy.ConnectFailed as exc:
                    sending.not_sent()
                    log.warning("%s; trying another pod", exc)
                    tried.add(pod.name)
                    self.router.unreachable(pod)

    async def _all_stuck(
        self,
        request: web.Request,
        model: Model,
        stuck: dict[str, float],
        started: web.StreamResponse | None,
    ) -> web.StreamResponse:
        """Every awake pod of the model was found stuck of late: answered at once."""
        retry = max(1, math.ceil(min(stuck.values())))
        pods = ", ".join(sorted(stuck))
        message = (
            f"every awake pod of model {model.model_name!r} ({pods}) started no answer for "
            f"{self.stalls.bound:g}s ({stalls_.FLAG}) while requests waited on it of late, and "
            f"gets no request for now; retry in {retry}s"
        )
        return await self._refuse(
            request,
            started,
            502,
            message,
            "upstream_stalled",
            reason="upstream_stalled",
            headers={"Retry-After": str(retry)},
        )

    async def _refuse(
        self,
        request: web.Request,
        started: web.StreamResponse | None,
        status: int,
        message: str,
        code: str,
        *,
        reason: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> web.StreamResponse:
        """An error of the gateway's own: an answer, or the final event of a stream begun."""
        reason = reason or REASONS[status]
        if started is None:
            return error_response(status, message, code=code, headers=headers, reason=reason)
        try:
            await bounded_write(
                started, sse_error(status, message, code=code), self.bounds.client_read, eof=True
            )
        except ClientStalled:
            return abandon(request, started)
        started[REJECTED] = reason
        return started


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


def unknown_model(name: str) -> web.Response:
    return error_response(
        404,
        f"The model `{name}` does not exist; GET /v1/models lists the models served here.",
        param="model",
        code="model_not_found",
    )


def _unserved(name: str, claim: Claim) -> web.Response:
    """No model holds `name`: unknown (404), claimed by several (503), or not yet claimed."""
    if not claim.named:
        return unknown_model(name)
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


def where_to_look(model: Model, *, name_it: bool) -> str:
    """The command that shows why a model did not wake. Its namespace and name only where the
    gateway may tell them (--expose-model-status): namespaces belong to tenants."""
    if name_it:
        return f"`kubectl describe im {model.name} -n {model.namespace}`"
    return "`kubectl describe im` in the model's namespace"


def no_engines(model: Model, *, name_it: bool) -> str:
    """Why a request for a model with no engine to wake is answered at once, and what shows
    its pods: the selector and namespace only where the gateway may tell them
    (--expose-model-status)."""
    assert model.spec is not None  # nothing_to_wake() said so
    if name_it:
        selector = shlex.quote(model.spec.selector.to_label_selector())
        look = (
            f"`kubectl get pods -l {selector} -n {shlex.quote(model.namespace)}` lists the pods "
            "it selects"
        )
    else:
        look = "`kubectl describe im` in the model's namespace shows its selector"
    return (
        f"model {model.model_name!r} has no engine to wake ({ConditionReason.NO_PODS}): no pod "
        "matches "
        f"its selector, and it has no scaleTargetRef for Snooze to scale up. {look}; start "
        f"its pods (or correct spec.selector), then retry in {NO_ENGINES_RETRY_SECONDS}s"
    )


def _failure(model: Model, waited: Waited, retry: int, *, name_it: bool) -> tuple[int, str, str]:
    """Status, message and code for a held request whose wait ended without an awake pod."""
    outcome = waited.outcome
    look = where_to_look(model, name_it=name_it)
    if outcome is Outcome.TIMEOUT:
        limit = model.hold_limit_name() if model.spec else "wake timeout"
        return (
            504,
            f"model {model.model_name!r} did not wake within its {limit}; {look} shows why",
            "wake_timeout",
        )
    if outcome is Outcome.FAILED and waited.failure is not None:
        failure = waited.failure
        # The condition's message names pods, engine addresses and what the engine said: for
        # the model's owners (kubectl), told to clients only with --expose-model-status.
        said = f": {failure.message.rstrip('.')}" if name_it else ""
        return (
            503,
            f"model {model.model_name!r} failed to wake ({failure.reason}){said}. "
            "The operator reported it and will not retry this wake (wake.onFailure: Report); "
            f"{look} shows more. Retry in {retry}s",
            "wake_failed",
        )
    if outcome is Outcome.NO_ENGINES:
        return 503, no_engines(model, name_it=name_it), NO_ENGINES
    if outcome is Outcome.NOT_ASKED and waited.not_asked is not None:
        return 503, str(waited.not_asked), "wake_request_failed"
    if outcome is Outcome.SHUTDOWN:
        return (
            503,
            "this gateway replica is shutting down; retry, another one will answer",
            "shutting_down",
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


def _one_line(text: str) -> str:
    """An SSE comment is one line: no line break from a status message may end it early."""
    return " ".join(text.split())
