"""The Pod handler: a pod's change pokes the loops of the models that select it, or did."""

from __future__ import annotations

from typing import Any

import kopf

from snooze.operator.indexes import candidates
from snooze.operator.runtime import Memo
from snooze.operator.sightings import PodSighting


# Async, as every event handler here, so that it runs in the operator's loop: kopf runs a sync
# handler in a thread, where setting a loop's asyncio.Event is unsafe (the wakeup can be lost)
# and the loops may change size while they are read.
async def pod_changed(
    body: kopf.Body, event: kopf.RawEvent, namespace: str | None, memo: Memo, **_: Any
) -> None:
    """Poke the models that select this pod, or selected it before a relabel, when what
    matters for routing or selection changed (not for the operator's own state label
    patches, which would only echo)."""
    started = memo.started
    info = started.indexes.pod(body, deleted=event.get("type") == "DELETED")
    key = (namespace or "", info.name)
    seen = PodSighting.of(info, deleted=event.get("type") == "DELETED")
    before = started.routing.get(key)
    if before == seen:
        return
    started.routing[key] = seen
    if event.get("type") == "DELETED":
        started.routing.pop(key, None)
    selectors = started.indexes.selectors
    for pod_labels in [info.labels, dict(before.labels)] if before else [info.labels]:
        for name, _selector in candidates(selectors, namespace or "", pod_labels):
            loop = started.loops.get((namespace or "", name))
            if loop is not None and loop.selects(pod_labels):
                loop.memory.poke.set()
