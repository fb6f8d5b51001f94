"""What the operator knows of every pod and model, between cycles: pods by namespace and by
label, models' claims on model names, and models' selectors by label.

kopf's own indexes did this until they met 10,000 models: kopf holds every object's handlers
until all indexes are filled at start-up, through one condition that each of the 20,000
objects' workers waits on and that every one of them notifies, and the operator labelled no
pod in four minutes (benchmarks/README.md). These are filled once by a list at start-up,
before kopf watches anything (so a model's loop never starts on a partial view), then kept
by the watch events kopf hands to the event handlers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kopf._cogs.structs.references import (  # kopf is pinned (pyproject.toml)
    NamespaceName,
    match_namespace,
)

from snooze.api import models
from snooze.api.conditions import ConditionType
from snooze.api.modelstatus import parse_status
from snooze.kube.api import KubeApi, NotFound, models_ref, pods_ref
from snooze.kube.index import Index, LabelKey, PodIndex
from snooze.kube.pods import PodInfo, pod_info
from snooze.operator.sightings import ModelSighting
from snooze.policy.claims import Claim


def selector_keys(namespace: str, selector: models.LabelSelector) -> list[LabelKey]:
    """A model's selector is filed under each of its matchLabels pairs (a pod it selects
    carries them all, so any one finds it); one without matchLabels under ("", ""), checked
    for every pod."""
    pairs = list(selector.match_labels.items()) or [("", "")]
    return [(namespace, key, value) for key, value in pairs]


def claim_of(
    body: Mapping[str, Any], spec: models.InferenceModelSpec | None
) -> tuple[str, Claim] | None:
    """A model's claim on its model name (None for an invalid spec, which claims nothing)."""
    if spec is None:
        return None
    meta = body.get("metadata") or {}
    model_name = spec.model_name or str(meta.get("name", ""))
    status = parse_status(body.get("status"))
    conflicted = any(
        c.type == ConditionType.CONFLICT and c.status == "True" for c in status.conditions
    )
    claim = Claim(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        created=str(meta.get("creationTimestamp", "")),
        holds=status.model_name == model_name and not conflicted,
    )
    return model_name, claim


class Indexes:
    """What the handlers and loops read: pods by namespace and label, claims on model names,
    and selectors by label."""

    def __init__(self) -> None:
        self.pods = PodIndex()
        self.claims: Index[str, Claim] = Index()
        self.selectors: Index[LabelKey, tuple[str, models.LabelSelector]] = Index()
        self._specs: dict[tuple[str, str], models.SpecMemo] = {}

    def pod(self, body: Mapping[str, Any], *, deleted: bool = False) -> PodInfo:
        info = pod_info(body)
        if deleted:
            self.pods.remove((info.namespace, info.name))
        else:
            # Under each of its labels: a model finds its pods without scanning the namespace
            # (a thousand models each scanning two thousand pods every cycle took a third of a
            # core).
            self.pods.put(info)
        return info

    def model(
        self, body: Mapping[str, Any], *, deleted: bool = False
    ) -> tuple[tuple[str, Claim] | None, models.LabelSelector | None]:
        """File a model's claim and selector; return them (None for an invalid spec, which
        claims and selects nothing), its spec parsed once per event."""
        meta = body.get("metadata") or {}
        namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        obj = (namespace, name)
        if deleted:
            self.claims.remove(obj)
            self.selectors.remove(obj)
            self._specs.pop(obj, None)
            return None, None
        validated = self.spec_memo(obj).validate(dict(body.get("spec") or {}))
        spec = None if isinstance(validated, models.SpecError) else validated
        # Every valid model's claim on its model name, across namespaces: who holds a name
        # claimed twice is decided from these (policy.claims.holder), by every loop alike.
        claim = claim_of(body, spec)
        self.claims.put(obj, {} if claim is None else {claim[0]: claim[1]})
        selector = spec.selector if spec is not None else None
        self.selectors.put(
            obj,
            {}
            if selector is None
            else {key: (name, selector) for key in selector_keys(namespace, selector)},
        )
        return claim, selector

    def models_in(self, namespace: str) -> list[str]:
        """The names of every model of a namespace, as the watches show them now."""
        return sorted(name for ns, name in self._specs if ns == namespace)

    def spec_memo(self, obj: tuple[str, str]) -> models.SpecMemo:
        """The model's validated spec, shared by this index and the model's loop."""
        return self._specs.setdefault(obj, models.SpecMemo())

    def pods_for(self, namespace: str, selector: models.LabelSelector) -> list[PodInfo]:
        """The pods of a namespace the selector may select (candidates: under its first
        matchLabels pair, or all the namespace's; the caller applies the whole selector)."""
        return self.pods.candidates(namespace, selector)

    async def load(self, api: KubeApi, namespaces: Iterable[str] = ()) -> None:
        """List every pod and model kopf is going to watch (all namespaces, or the given
        ones, which may be patterns as kopf's are)."""
        scopes = list(namespaces)
        exact = [ns for ns in scopes if not any(c in ns for c in "*?[!, ")]
        listed = exact if scopes and len(exact) == len(scopes) else [None]
        for scope in listed:
            for item in (await api.list(pods_ref(scope))).get("items") or []:
                if _wanted(item, scopes):
                    self.pod(item)
            try:
                found = (await api.list(models_ref(scope))).get("items") or []
            except NotFound:  # the CRD is not installed yet: kopf is restarted when it is
                found = []
            for item in found:
                if _wanted(item, scopes):
                    self.model(item)


def _wanted(item: Mapping[str, Any], scopes: Sequence[str]) -> bool:
    # kopf's own rule (globs, `!` exclusions, comma-separated parts), so that the list covers
    # exactly what kopf is going to watch.
    namespace = str((item.get("metadata") or {}).get("namespace") or "")
    return not scopes or any(match_namespace(NamespaceName(namespace), p) for p in scopes)


def candidates(
    index: Index[LabelKey, tuple[str, models.LabelSelector]],
    namespace: str,
    labels: Mapping[str, str],
) -> list[tuple[str, models.LabelSelector]]:
    """The models of a namespace whose selectors may select a pod with these labels (each
    once): those indexed under one of its labels, and those without matchLabels. At a
    thousand models a pod has one or two, where checking every model's selector for every
    pod in every cycle was quadratic."""
    found: dict[str, tuple[str, models.LabelSelector]] = {}
    for key, value in [*labels.items(), ("", "")]:
        for name, selector in index.get((namespace, key, value), []):
            found.setdefault(name, (name, selector))
    return list(found.values())


ModelKey = tuple[str, str]
"""A model's (namespace, name)."""


@dataclasses.dataclass
class ModelSightings:
    """What the models' last events showed, kept by one run's handlers (several operators run
    in one process in the tests, each with its own)."""

    seen: dict[ModelKey, ModelSighting] = dataclasses.field(default_factory=dict)
    """What of each model last poked its loop."""
    pods: dict[ModelKey, dict[str, Mapping[str, str]]] = dataclasses.field(default_factory=dict)
    """The pods each model selected at its last such event: its old neighbours, after a
    change."""

    def neighbours(
        self,
        indexes: Indexes,
        key: ModelKey,
        names: set[str],
        selector: models.LabelSelector | None,
    ) -> set[ModelKey]:
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
