"""The kopf handlers: watch models and pods, and hand each model to a loop of its own."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Iterable, Mapping
from typing import Any

import kopf

from snooze.api import gpupool, models
from snooze.api.agreed import STATE_LABEL
from snooze.api.modelstatus import parse_status
from snooze.engine.client import ACTION_LEASE_SECONDS, new_http_client
from snooze.engine.probe import Prober
from snooze.kube import api as kube_api
from snooze.kube.api import KubeApi
from snooze.kube.pods import PodInfo
from snooze.operator.actions import Settings
from snooze.operator.discovery import restart_when_served
from snooze.operator.events import teller
from snooze.operator.gateways import GatewayTraffic
from snooze.operator.gateways import stop as stop_task
from snooze.operator.indexes import candidates
from snooze.operator.loop import ModelLoop, Neighbours
from snooze.operator.pools import PoolLoop
from snooze.operator.release import release
from snooze.operator.runtime import Runtime, until_stopped
from snooze.operator.startup import first_reads

PREFIX = models.GROUP
log = logging.getLogger(__name__)


class NoDiffBase(kopf.DiffBaseStorage):
    """No diff base: kopf keeps a copy of each object in an annotation to tell a creation from
    an update for its change handlers, and the operator's only one (`hand_back`, on deletion)
    needs none: kopf tells a deletion from the deletion timestamp and the finalizer. Keeping
    it cost a patch of every model at its creation, and a deep copy of every pod and model at
    each of their events (with 10,000 models, kopf was still writing those patches minutes
    after every pod was labelled)."""

    def build(
        self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None
    ) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


def configure(settings: kopf.OperatorSettings, ours: Settings) -> None:
    """kopf's own marks go under snooze.dev, not kopf.zalando.org."""
    settings.persistence.finalizer = f"{PREFIX}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PREFIX)
    settings.persistence.diffbase_storage = NoDiffBase()
    settings.posting.reporting_component = "snooze-operator"
    settings.posting.event_name_prefix = "snooze-"
    # Only the resources below are watched: no list or watch of every CRD and namespace of
    # the cluster (and no RBAC for it). A CRD installed later is seen through discovery
    # instead (runner.py).
    settings.scanning.disabled = True
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.error_backoffs = (0.2, 0.5, 1, 2, 5, 10)
    settings.peering.lifetime = ours.peering_lifetime
    # How long kopf waits for a stopped daemon to end by itself before the backoff (and a
    # cancellation) apply: a model loop ends at its next wait, normally within milliseconds.
    settings.background.instant_exit_timeout = 2.0


def build_registry(runtime: Runtime) -> kopf.OperatorRegistry:
    """All handlers, in a registry of their own (so tests can run several operators)."""
    registry = kopf.OperatorRegistry()
    # What of each model last poked its loop: generation, annotations, deletion.
    model_seen: dict[tuple[str, str], tuple[Any, ...]] = {}
    # The pods each model selected at its last such event: its old neighbours, after a change.
    model_pods: dict[tuple[str, str], dict[str, Mapping[str, str]]] = {}

    @kopf.on.login(id="login", registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        # kopf and Snooze's own client use the same credentials, found the same way.
        return kube_api.login()

    @kopf.on.startup(id="startup", registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure(settings, runtime.settings)
        runtime.api = KubeApi.from_environment()
        runtime.prober = Prober(
            limit=64,
            timeout=runtime.settings.probe_timeout,
            ssl_context=ssl.create_default_context(),
        )
        runtime.action_http = new_http_client(max_connections=256, lease=ACTION_LEASE_SECONDS)
        runtime.gateways = GatewayTraffic(
            api=runtime.api,
            urls=runtime.settings.gateway_metrics,
            service=runtime.settings.gateway_service,
            interval=runtime.settings.probe_interval,
            timeout=runtime.settings.probe_timeout,
            metrics=runtime.metrics,
        )
        if runtime.gateways.enabled:
            runtime.pools.traffic = runtime.gateways.traffic
            runtime.pools.hurry = runtime.gateways.hurry
            runtime.pools.held = runtime.gateways.held
            runtime.gateways.scraped.append(runtime.pools.scraped)
        runtime.closing = False
        # Before kopf watches anything: no model's loop starts on a partial view of the pods
        # and of the other models' claims. kopf's events keep them from here on.
        runtime.indexes, missing = await first_reads(runtime.api, runtime.namespaces)
        # Once the API answers: until then, its reads of the gateway's endpoints would only
        # add failures to the start-up's one line per attempt.
        runtime.gateway_task = asyncio.create_task(runtime.gateways.run(), name="gateway-traffic")
        if missing:
            runtime.crd_watch = asyncio.create_task(
                restart_when_served(
                    runtime.api,
                    runtime.restart,
                    missing=missing,
                    interval=runtime.settings.crd_poll_interval,
                )
            )

    @kopf.on.cleanup(id="cleanup", registry=registry)
    async def cleanup(**_: Any) -> None:
        runtime.closing = True
        for loop in list(runtime.loops.values()):
            loop.memory.poke.set()
        if runtime.crd_watch is not None:
            runtime.crd_watch.cancel()
            runtime.crd_watch = None
        if runtime.api is not None:
            await runtime.api.aclose()
        if runtime.action_http is not None:
            await runtime.action_http.aclose()
        if runtime.prober is not None:
            await runtime.prober.aclose()
        await stop_task(runtime.gateway_task)

    # The event handlers are async so that they run in the operator's loop: kopf runs a sync
    # handler in a thread, where setting a loop's asyncio.Event is unsafe (the wakeup can be
    # lost) and runtime.loops may change size while it is read.
    @kopf.on.event("pods", id="pod_changed", registry=registry)
    async def pod_changed(
        body: kopf.Body, event: kopf.RawEvent, namespace: str | None, **kwargs: Any
    ) -> None:
        # Poke the models that select this pod, or selected it before a relabel, when what
        # matters for routing or selection changed (not for the operator's own state label
        # patches, which would only echo).
        info = runtime.indexes.pod(body, deleted=event.get("type") == "DELETED")
        key = (namespace or "", info.name)
        labels = tuple(sorted((k, v) for k, v in info.labels.items() if k != STATE_LABEL))
        fingerprint = (info.ready, info.ip, info.uid, event.get("type") == "DELETED", labels)
        before = runtime.routing.get(key)
        if before == fingerprint:
            return
        runtime.routing[key] = fingerprint
        if event.get("type") == "DELETED":
            runtime.routing.pop(key, None)
        selectors = runtime.indexes.selectors
        for pod_labels in [info.labels, dict(before[4])] if before else [info.labels]:
            for name, _selector in candidates(selectors, namespace or "", pod_labels):
                loop = runtime.loops.get((namespace or "", name))
                if loop is not None and loop.selects(pod_labels):
                    loop.memory.poke.set()

    @kopf.on.event(
        models.GROUP, models.VERSION, models.PLURAL, id="model_changed", registry=registry
    )
    async def model_changed(
        body: kopf.Body, namespace: str | None, name: str, **kwargs: Any
    ) -> None:
        # The daemon's body is live; a poke makes it act on a spec change or a wake request
        # within one watch event rather than at the next probe. The loop's own status patches
        # come back as events too: those must not poke, or each status write costs a cycle of
        # probes (a third more probes at 1,000 models under traffic).
        key = (namespace or "", name)
        claim, selector = runtime.indexes.model(body, deleted=kwargs.get("type") == "DELETED")
        meta = body.get("metadata", {})
        seen = (
            meta.get("generation"),
            tuple(sorted((meta.get("annotations") or {}).items())),
            meta.get("deletionTimestamp"),
            claim,
        )
        before = model_seen.get(key)
        if kwargs.get("type") == "DELETED":
            model_seen.pop(key, None)
        elif before == seen:
            return
        else:
            model_seen[key] = seen
        loop = runtime.loops.get(key)
        if loop is not None:
            loop.memory.poke.set()
        # A model that appears, goes, or changes its name, selector or hold on a name changes
        # what its neighbours may do: the models that claim the same name, and those that
        # select a pod it selects or selected, look again. Only those: poking the whole
        # namespace made start-up quadratic (10,000 models, each poking the 9,999 others).
        if (
            before is None
            or kwargs.get("type") == "DELETED"
            or before[:1] != seen[:1]
            or (before[3] != claim)
        ):
            names = {c[0] for c in (claim, before[3] if before else None) if c is not None}
            selected = (
                {}
                if selector is None
                else {
                    p.name: p.labels
                    for p in runtime.indexes.pods_for(key[0], selector)
                    if selector.matches(p.labels)
                }
            )
            pods_before = model_pods.pop(key, {})
            if selected:
                model_pods[key] = selected
            neighbours = {
                (c.namespace, c.name) for name in names for c in runtime.indexes.claims.get(name)
            }
            for labels in [*pods_before.values(), *selected.values()]:
                for other, _ in candidates(runtime.indexes.selectors, key[0], labels):
                    neighbours.add((key[0], other))
            neighbours.discard(key)
            for neighbour in neighbours:
                other_loop = runtime.loops.get(neighbour)
                if other_loop is not None:
                    other_loop.memory.poke.set()

    @kopf.daemon(
        models.GROUP,
        models.VERSION,
        models.PLURAL,
        id="model",
        registry=registry,
        # A deleted model's loop ends at its next wait (at once when idle, or once the cycle
        # in progress ends); only one stuck beyond the backoff is cancelled, with a warning.
        cancellation_backoff=15.0,
        cancellation_timeout=5.0,
    )
    async def model_daemon(
        stopped: kopf.DaemonStopped,
        body: kopf.Body,
        namespace: str | None,
        name: str,
        **kwargs: Any,
    ) -> None:
        indexes = runtime.indexes
        claims, selectors = indexes.claims, indexes.selectors
        assert runtime.api is not None
        namespace = namespace or ""

        def pods(selector: models.LabelSelector) -> Iterable[PodInfo]:
            return indexes.pods_for(namespace, selector)  # candidates: the loop selects

        emit = teller(body)

        assert runtime.prober is not None
        loop = ModelLoop(
            namespace=namespace,
            name=name,
            body=body,
            pods=pods,
            api=runtime.api,
            prober=runtime.prober,
            action_http=runtime.action_http,
            settings=runtime.settings,
            emit=emit,
            metrics=runtime.metrics,
            neighbours=Neighbours(
                claims=lambda model_name: list(claims.get(model_name, [])),
                selectors=lambda ns, labels: candidates(selectors, ns, labels),
            ),
            pools=runtime.pools,
            traffic=runtime.gateways.traffic if runtime.gateways is not None else _no_traffic,
            spec_memo=indexes.spec_memo((namespace, name)),
        )
        runtime.loops[(namespace, name)] = loop

        try:
            await until_stopped(loop.run, loop.poke, stopped, runtime, f"{namespace}/{name}")
        finally:
            loop.stop()
            runtime.loops.pop((namespace, name), None)

    @kopf.on.event(
        models.GROUP, models.VERSION, gpupool.PLURAL, id="pool_changed", registry=registry
    )
    def pool_changed(namespace: str | None, name: str, **_: Any) -> None:
        # Its spec is read live by its loop: a change is acted on now, not at the next interval.
        loop = runtime.pools.loops.get((namespace or "", name))
        if loop is not None:
            loop.poke()

    @kopf.daemon(
        models.GROUP,
        models.VERSION,
        gpupool.PLURAL,
        id="pool",
        registry=registry,
        # As for a model: a deleted pool's loop ends at its next wait, woken by the stop.
        cancellation_backoff=15.0,
        cancellation_timeout=5.0,
    )
    async def pool_daemon(
        stopped: kopf.DaemonStopped, body: kopf.Body, namespace: str | None, name: str, **_: Any
    ) -> None:
        # One coordinator per GPUPool: the only place that decides who wakes on its device.
        assert runtime.api is not None
        namespace = namespace or ""

        emit = teller(body, what="pool")

        def members() -> list[ModelLoop]:
            return [loop for (ns, _), loop in runtime.loops.items() if ns == namespace]

        loop = PoolLoop(
            namespace=namespace,
            name=name,
            body=body,
            api=runtime.api,
            hub=runtime.pools,
            models=members,
            emit=emit,
            metrics=runtime.metrics,
            interval=runtime.settings.probe_interval,
            expected=lambda: runtime.indexes.models_in(namespace) if runtime.indexes else (),
        )
        runtime.pools.loops[(namespace, name)] = loop

        try:
            await until_stopped(loop.run, loop.poke, stopped, runtime, f"pool:{namespace}/{name}")
        finally:
            runtime.pools.loops.pop((namespace, name), None)
            loop.stop()

    @kopf.on.delete(models.GROUP, models.VERSION, models.PLURAL, id="hand_back", registry=registry)
    async def hand_back(
        body: kopf.Body, spec: kopf.Spec, status: kopf.Status, namespace: str | None, **kwargs: Any
    ) -> None:
        # Deleting a model must not strand its engines asleep (requests would hang there) or
        # its workload at zero: give everything back as it was before Snooze.
        assert runtime.api is not None
        index = runtime.indexes.pods.by_namespace
        emit = teller(body)
        await release(
            api=runtime.api,
            http=runtime.action_http,
            namespace=namespace or "",
            raw_spec=dict(spec),
            status=parse_status(status),
            pods=list(index.get(namespace or "", [])),
            emit=emit,
        )

    return registry


def _no_traffic(namespace: str, pod: str) -> None:
    return None
