"""The operator's kopf handlers, in a registry of their own: its lifecycle, then one module per
resource it watches (pods, InferenceModels, GPUPools)."""

from __future__ import annotations

import kopf

from snooze.operator.handlers import lifecycle
from snooze.operator.handlers import model as modelhandlers
from snooze.operator.handlers import pod as podhandlers
from snooze.operator.handlers import pool as poolhandlers
from snooze.operator.runtime import Runtime


def build_registry(runtime: Runtime) -> kopf.OperatorRegistry:
    """All handlers, in a registry of their own (so tests can run several operators)."""
    registry = kopf.OperatorRegistry()
    lifecycle.register(registry, runtime)
    podhandlers.register(registry, runtime)
    modelhandlers.register(registry, runtime)
    poolhandlers.register(registry, runtime)
    return registry
