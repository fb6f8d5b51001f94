"""The InferenceModel handlers: each model's loop runs as its daemon, a change pokes it and
its neighbours, and a deletion hands its engines and workload back as they were."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import kopf

from snooze.api import models
from snooze.api.modelstatus import parse_status
from snooze.kube.pods import PodInfo
from snooze.operator.events.teller import teller
from snooze.operator.indexes import candidates
from snooze.operator.model.loop import ModelLoop
from snooze.operator.model.release import release
from snooze.operator.model.selection import Neighbours
from snooze.operator.runtime import Memo, until_stopped
from snooze.operator.sightings import ModelSighting


# Async, as pod_changed is (handlers/pod.py): it sets the loops' asyncio.Events, which is
# only safe from the operator's own loop.
async def model_changed(
    body: kopf.Body, namespace: str | None, name: str, memo: Memo, **kwargs: Any
) -> None:
    """Poke the model's loop, and its neighbours' when what they may do changed."""
    # The daemon's body is live; a poke makes it act on a spec change or a wake request
    # within one watch event rather than at the next probe. The loop's own status patches
    # come back as events too: those must not poke, or each status write costs a cycle of
    # probes (a third more probes at 1,000 models under traffic).
    started = memo.started
    sightings = started.sightings
    key = (namespace or "", name)
    claim, selector = started.indexes.model(body, deleted=kwargs.get("type") == "DELETED")
    seen = ModelSighting.of(body, claim)
    before = sightings.seen.get(key)
    if kwargs.get("type") == "DELETED":
        sightings.seen.pop(key, None)
    elif before == seen:
        return
    else:
        sightings.seen[key] = seen
    loop = started.loops.get(key)
    if loop is not None:
        loop.memory.poke.set()
    # A model that appears, goes, or changes its name, selector or hold on a name changes
    # what its neighbours may do: the models that claim the same name, and those that
    # select a pod it selects or selected, look again. Only those: poking the whole
    # namespace made start-up quadratic (10,000 models, each poking the 9,999 others).
    if (
        before is None
        or kwargs.get("type") == "DELETED"
        or before.generation != seen.generation
        or before.claim != claim
    ):
        names = {n for n in (seen.claimed_name(), before and before.claimed_name()) if n}
        for neighbour in sightings.neighbours(started.indexes, key, names, selector):
            other_loop = started.loops.get(neighbour)
            if other_loop is not None:
                other_loop.memory.poke.set()


async def model_daemon(
    stopped: kopf.DaemonStopped,
    body: kopf.Body,
    namespace: str | None,
    name: str,
    memo: Memo,
    **_: Any,
) -> None:
    """The model's loop, from its first sighting until kopf stops it."""
    started, runtime = memo.started, memo.runtime
    indexes = started.indexes
    claims, selectors = indexes.claims, indexes.selectors
    namespace = namespace or ""

    def pods(selector: models.LabelSelector) -> Iterable[PodInfo]:
        return indexes.pods_for(namespace, selector)  # candidates: the loop selects

    loop = ModelLoop(
        namespace=namespace,
        name=name,
        body=body,
        pods=pods,
        api=started.api,
        prober=started.prober,
        action_http=started.action_http,
        settings=runtime.settings,
        emit=teller(body, recorder=started.recorder),
        metrics=runtime.metrics,
        neighbours=Neighbours(
            claims=lambda model_name: list(claims.get(model_name, [])),
            selectors=lambda ns, labels: candidates(selectors, ns, labels),
        ),
        pools=started.pools,
        traffic=started.gateways.traffic,
        spec_memo=indexes.spec_memo((namespace, name)),
        pickers=started.pickers,
    )
    started.add_loop((namespace, name), loop)

    try:
        await until_stopped(loop.run, loop.poke, stopped, started, f"{namespace}/{name}")
    finally:
        loop.stop()
        started.remove_loop((namespace, name))


async def hand_back(
    body: kopf.Body,
    spec: kopf.Spec,
    status: kopf.Status,
    namespace: str | None,
    memo: Memo,
    **_: Any,
) -> None:
    """Deleting a model must not strand its engines asleep (requests would hang there) or its
    workload at zero: give everything back as it was before Snooze."""
    started = memo.started
    await release(
        api=started.api,
        http=started.action_http,
        namespace=namespace or "",
        raw_spec=dict(spec),
        status=parse_status(status),
        pods=list(started.indexes.pods.by_namespace.get(namespace or "", [])),
        emit=teller(body, recorder=started.recorder),
    )
