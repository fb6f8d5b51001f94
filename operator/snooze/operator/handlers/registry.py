"""The operator's kopf handlers, in a registry of their own: its lifecycle, then one module per
resource it watches (pods, InferenceModels, GPUPools). The handlers are functions of their
modules, which read what they share from kopf's memo (runtime.py); this is their wiring."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import kopf

from snooze.api import gpupool, models
from snooze.operator.handlers import lifecycle
from snooze.operator.handlers import model as modelhandlers
from snooze.operator.handlers import pod as podhandlers
from snooze.operator.handlers import pool as poolhandlers

MODELS = (models.GROUP, models.VERSION, models.PLURAL)
POOLS = (models.GROUP, models.VERSION, gpupool.PLURAL)


def daemon(
    registry: kopf.OperatorRegistry,
    resource: tuple[str, str, str],
    handler_id: str,
    fn: Callable[..., Awaitable[None]],
) -> None:
    """A loop per object of `resource`. A deleted object's loop ends at its next wait (at once
    when idle, or once the cycle in progress ends); only one stuck beyond the backoff is
    cancelled, with a warning."""
    kopf.daemon(
        *resource,
        id=handler_id,
        registry=registry,
        cancellation_backoff=15.0,
        cancellation_timeout=5.0,
    )(fn)


def build_registry() -> kopf.OperatorRegistry:
    """All handlers, in a registry of their own (so tests can run several operators)."""
    registry = kopf.OperatorRegistry()
    kopf.on.login(id="login", registry=registry)(lifecycle.login)
    kopf.on.startup(id="startup", registry=registry)(lifecycle.startup)
    kopf.on.cleanup(id="cleanup", registry=registry)(lifecycle.cleanup)
    kopf.on.event("pods", id="pod_changed", registry=registry)(podhandlers.pod_changed)
    kopf.on.event(*MODELS, id="model_changed", registry=registry)(modelhandlers.model_changed)
    daemon(registry, MODELS, "model", modelhandlers.model_daemon)
    kopf.on.delete(*MODELS, id="hand_back", registry=registry)(modelhandlers.hand_back)
    kopf.on.event(*POOLS, id="pool_changed", registry=registry)(poolhandlers.pool_changed)
    daemon(registry, POOLS, "pool", poolhandlers.pool_daemon)
    return registry
