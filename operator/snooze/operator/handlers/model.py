"""The InferenceModel handlers: each model's loop runs as its daemon, a change pokes it and
its neighbours, and a deletion hands its engines and workload back as they were."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

import kopf

from snooze.api import models
from snooze.api.modelstatus import parse_status
from snooze.kube.pods import PodInfo
from snooze.operator.events.teller import teller
from snooze.operator.indexes import Indexes, candidates
from snooze.operator.model.loop import ModelLoop, Neighbours
from snooze.operator.model.release import release
from snooze.operator.runtime import Runtime, until_stopped
from snooze.operator.sightings import ModelSighting

Key = tuple[str, str]
"""A model's (namespace, name)."""


@dataclasses.dataclass
class ModelSightings:
    """What the models' last events showed, kept by one registry's handlers (several operators
    run in one process in the tests, each with its own)."""

    seen: dict[Key, ModelSighting] = dataclasses.field(default_factory=dict)
    """What of each model last poked its loop."""
    pods: dict[Key, dict[str, Mapping[str, str]]] = dataclasses.field(default_factory=dict)
    """The pods each model selected at its last such event: its old neighbours, after a
    change."""

    def neighbours(
        self,
        indexes: Indexes,
        key: Key,
        names: set[str],
        selector: models.LabelSelector | None,
    ) -> set[Key]:
        """The models that claim one of `names`, and those that select a pod this model
        selects now or selected at its last change (which it then forgets for the pods it
        selects now)."""
        selected = (
            {}
            if selector is None
            else {
                p.name: p.labels
                for p in indexes.pods_for(key[0], selector)
                if selector.matches(p.labels)
            }
        )
        pods_before = self.pods.pop(key, {})
        if selected:
            self.pods[key] = selected
        neighbours = {(c.namespace, c.name) for name in names for c in indexes.claims.get(name)}
        for labels in [*pods_before.values(), *selected.values()]:
            for other, _ in candidates(indexes.selectors, key[0], labels):
                neighbours.add((key[0], other))
        neighbours.discard(key)
        return neighbours


def register(registry: kopf.OperatorRegistry, runtime: Runtime) -> None:
    """The models' event handler, daemon and deletion handler, into `registry`."""
    sightings = ModelSightings()

    # Async, as pod_changed is (handlers/pod.py): it sets the loops' asyncio.Events, which is
    # only safe from the operator's own loop.
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
        seen = ModelSighting.of(body, claim)
        before = sightings.seen.get(key)
        if kwargs.get("type") == "DELETED":
            sightings.seen.pop(key, None)
        elif before == seen:
            return
        else:
            sightings.seen[key] = seen
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
            or before.generation != seen.generation
            or before.claim != claim
        ):
            names = {n for n in (seen.claimed_name(), before and before.claimed_name()) if n}
            for neighbour in sightings.neighbours(runtime.indexes, key, names, selector):
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

        emit = teller(body, recorder=runtime.events())

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
            pickers=runtime.pickers,
        )
        runtime.add_loop((namespace, name), loop)

        try:
            await until_stopped(loop.run, loop.poke, stopped, runtime, f"{namespace}/{name}")
        finally:
            loop.stop()
            runtime.remove_loop((namespace, name))

    @kopf.on.delete(models.GROUP, models.VERSION, models.PLURAL, id="hand_back", registry=registry)
    async def hand_back(
        body: kopf.Body, spec: kopf.Spec, status: kopf.Status, namespace: str | None, **kwargs: Any
    ) -> None:
        # Deleting a model must not strand its engines asleep (requests would hang there) or
        # its workload at zero: give everything back as it was before Snooze.
        assert runtime.api is not None
        index = runtime.indexes.pods.by_namespace
        emit = teller(body, recorder=runtime.events())
        await release(
            api=runtime.api,
            http=runtime.action_http,
            namespace=namespace or "",
            raw_spec=dict(spec),
            status=parse_status(status),
            pods=list(index.get(namespace or "", [])),
            emit=emit,
        )


def _no_traffic(namespace: str, pod: str) -> None:
    return None
