"""Keeps the registry in step with the API: list, then watch, and re-list whenever a watch ends."""

from __future__ import annotations

import asyncio
import logging

from snooze.gateway.models.registry import MODELS, Registry
from snooze.kube.api import KubeApi, NotFound, Ref, models_ref, pods_ref

log = logging.getLogger(__name__)
# Backoff after a failed list or watch, so that an API outage is not hammered.
RETRY_DELAYS = (0.2, 0.5, 1.0, 2.0, 5.0)
# How often to look again for InferenceModels while their CRD is not installed: a 404 is
# cheap, and the first requests come soon after `kubectl apply -f crds/`.
CRD_CHECK_SECONDS = 1.0


def ref_for(kind: str, scope: str | None) -> Ref:
    return models_ref(scope) if kind == MODELS else pods_ref(scope)


async def follow(
    api: KubeApi, registry: Registry, *, kind: str, scope: str | None, watch_seconds: int
) -> None:
    """Run until cancelled. Re-lists after every watch end: events may have been missed."""
    ref = ref_for(kind, scope)
    failures = 0
    waiting_for_crd = False
    while True:
        try:
            listing = await api.list(ref)
            if waiting_for_crd:
                log.info("the InferenceModel CRD is installed: serving InferenceModels")
                waiting_for_crd = registry.crd_missing = False
            registry.replace(kind, scope, listing.get("items") or [])
            version = str((listing.get("metadata") or {}).get("resourceVersion", ""))
            async for event in api.watch(
                ref, resource_version=version, timeout_seconds=watch_seconds
            ):
                failures = 0
                kind_of_event = str(event.get("type", ""))
                if kind_of_event == "ERROR":
                    # Typically 410 Gone (our version is too old): only a re-list recovers.
                    log.info("watch %s ended with %s; re-listing", ref.path, event.get("object"))
                    break
                if kind_of_event != "BOOKMARK":
                    registry.apply(kind, kind_of_event, event.get("object") or {})
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # any failure of list or watch: back off and re-list
            if isinstance(exc, NotFound) and kind == MODELS:
                # Not an outage: the CRD is not installed yet (the gateway started first).
                if not waiting_for_crd:
                    log.info(
                        "InferenceModels are served once their CRD is installed "
                        "(kubectl apply -f crds/); checking every %gs",
                        CRD_CHECK_SECONDS,
                    )
                    waiting_for_crd = registry.crd_missing = True
                    registry.poke()  # requests waiting for the list answer at once
                await asyncio.sleep(CRD_CHECK_SECONDS)
                continue
            delay = RETRY_DELAYS[min(failures, len(RETRY_DELAYS) - 1)]
            failures += 1
            log.warning("list/watch of %s failed (%s); retrying in %ss", ref.path, exc, delay)
            await asyncio.sleep(delay)
