"""The operator's own handlers: its login, its start-up (kopf's settings, the clients, the
first reads) and its cleanup."""

from __future__ import annotations

import asyncio
import collections
import ssl
from collections.abc import Iterable
from typing import Any

import kopf

from snooze.api import models
from snooze.engine.client import ACTION_LEASE_SECONDS, new_http_client
from snooze.engine.http import EngineHttp
from snooze.engine.probe import Prober
from snooze.kube import api as kube_api
from snooze.kube.api import KubeApi
from snooze.kube.writes import FairWrites
from snooze.operator.discovery import restart_when_served
from snooze.operator.events.recorder import EventRecorder
from snooze.operator.pool.loop import PoolHub
from snooze.operator.runtime import Memo, Started
from snooze.operator.settings import WRITE_BURST_INTERVALS, Settings, budget_per_minute
from snooze.operator.startup import first_reads
from snooze.operator.traffic.gateways import GatewayTraffic
from snooze.operator.traffic.pickers import PickerQueues

PREFIX = models.GROUP


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


def pools_reading(gateways: GatewayTraffic, pickers: PickerQueues | None = None) -> PoolHub:
    """The hub of the pool loops, reading what the gateways say when any is given (and nothing
    otherwise); it hears of each scrape, so that a pool waiting on a busy member looks again.
    The requests held for a model's wake are those the gateways hold and those queued at its
    endpoint pickers, together."""

    def held(namespace: str, model: str) -> int | None:
        counts = [
            count
            for count in (
                gateways.held(namespace, model) if gateways.enabled else None,
                pickers.queued(namespace, model) if pickers is not None else None,
            )
            if count is not None
        ]
        return sum(counts) if counts else None

    if not gateways.enabled:
        return PoolHub(held=held)
    hub = PoolHub(traffic=gateways.traffic, hurry=gateways.hurry, held=held)
    gateways.scraped.append(hub.scraped)
    return hub


def login(**_: Any) -> kopf.ConnectionInfo:
    """kopf and Snooze's own client use the same credentials, found the same way."""
    return kube_api.login()


async def startup(settings: kopf.OperatorSettings, memo: Memo, **_: Any) -> None:
    """kopf's settings, the clients, the first reads of the API, then what runs beside kopf:
    all of it in `memo.started`, for every other handler of this run."""
    runtime = memo.runtime
    ours = runtime.settings
    configure(settings, ours)
    models: collections.Counter[str] = collections.Counter()
    writes = FairWrites(
        per_model_per_minute=budget_per_minute(ours),
        burst_per_model=ours.write_budget * WRITE_BURST_INTERVALS,
        models=lambda namespace: models[namespace],
    )
    api = KubeApi.from_environment(writes=writes)
    recorder = EventRecorder(api)
    recorder.start()
    prober = Prober(limit=64, timeout=ours.probe_timeout, ssl_context=ssl.create_default_context())
    action_http = new_http_client(max_connections=256, lease=ACTION_LEASE_SECONDS)
    gateways = GatewayTraffic(
        api=api,
        urls=ours.gateway_metrics,
        service=ours.gateway_service,
        interval=ours.probe_interval,
        timeout=ours.probe_timeout,
        metrics=runtime.metrics,
    )
    # Before kopf watches anything: no model's loop starts on a partial view of the pods
    # and of the other models' claims. kopf's events keep them from here on.
    try:
        indexes, missing = await first_reads(api, runtime.namespaces)
    except BaseException:
        # kopf runs the cleanup handler only after a start-up that finished: a SIGTERM while
        # the API does not answer cancels this one, and would leave the clients open.
        await close(recorder, api, action_http, prober)
        raise
    pickers = (
        PickerQueues(
            api=api,
            interval=ours.picker_interval,
            refresh=ours.probe_interval,
            timeout=ours.probe_timeout,
            pod_addresses=lambda namespace: {
                pod.ip
                for pod in indexes.pods.by_namespace.get(namespace)
                if pod.ip and not pod.deleting
            },
            token_file=ours.picker_token_file,
        )
        if ours.inference_gateway
        else None
    )
    started = memo.started = Started(
        api=api,
        recorder=recorder,
        prober=prober,
        action_http=action_http,
        gateways=gateways,
        pickers=pickers,
        # Before kopf starts a daemon: every model and pool loop of this run shares this hub.
        pools=pools_reading(gateways, pickers),
        indexes=indexes,
        models=models,
    )
    # Once the API answers: until then, its reads of the gateway's endpoints would only
    # add failures to the start-up's one line per attempt.
    started.tasks.append(asyncio.create_task(gateways.run(), name="gateway-traffic"))
    if pickers is not None:
        started.tasks.append(asyncio.create_task(pickers.run(), name="pickers"))
    if missing:
        watch = restart_when_served(
            api, runtime.restart, missing=missing, interval=ours.crd_poll_interval
        )
        started.tasks.append(asyncio.create_task(watch, name="crd-watch"))


async def cleanup(memo: Memo, **_: Any) -> None:
    """End what start-up made: the loops at their next wait, the tasks beside kopf, the
    Events' recorder (before its client closes), and the clients."""
    started = memo.started
    started.closing = True
    for loop in list(started.loops.values()):
        loop.memory.poke.set()
    for task in started.tasks:
        task.cancel()
    # An error a task ended with is no reason to leave the clients below open.
    await asyncio.gather(*started.tasks, return_exceptions=True)
    await close(started.recorder, started.api, started.action_http, started.prober)


async def close(
    recorder: EventRecorder, api: KubeApi, action_http: EngineHttp, prober: Prober
) -> None:
    """The Events' recorder (before its client closes), then the clients."""
    await recorder.stop()
    await api.aclose()
    await action_http.aclose()
    await prober.aclose()
