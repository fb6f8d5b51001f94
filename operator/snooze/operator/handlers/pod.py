"""The Pod handler: a pod's change pokes the loops of the models that select it, or did."""

from __future__ import annotations

from typing import Any

import kopf

from snooze.operator.indexes import candidates
from snooze.operator.runtime import Runtime
from snooze.operator.sightings import PodSighting


def register(registry: kopf.OperatorRegistry, runtime: Runtime) -> None:
    """The pods' event handler, into `registry`."""

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
        seen = PodSighting.of(info, deleted=event.get("type") == "DELETED")
        before = runtime.routing.get(key)
        if before == seen:
            return
        runtime.routing[key] = seen
        if event.get("type") == "DELETED":
            runtime.routing.pop(key, None)
        selectors = runtime.indexes.selectors
        for pod_labels in [info.labels, dict(before.labels)] if before else [info.labels]:
            for name, _selector in candidates(selectors, namespace or "", pod_labels):
                loop = runtime.loops.get((namespace or "", name))
                if loop is not None and loop.selects(pod_labels):
                    loop.memory.poke.set()
