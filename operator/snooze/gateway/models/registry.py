"""The gateway's watch-fed view of InferenceModels and their pods: what exists and what is awake."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from snooze.api.models import EngineState, LabelSelector
from snooze.gateway.models.model import Key, Model, model_from
from snooze.kube.index import Index, PodIndex
from snooze.kube.pods import PodInfo, pod_info

MODELS = "models"
PODS = "pods"
POD_RETURN_SECONDS = 10.0
"""How long a pod that went counts as coming back: its controller recreates a deleted pod (a
rollout, an eviction, the operator's restart of a pod whose wake failed) within a second or
so, and meanwhile its model's selector may match no pod at all."""


def key_of(obj: Mapping[str, Any]) -> Key:
    """An object's (namespace, name), as its metadata says."""
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace", "")), str(meta.get("name", "")))


def routable(pod: PodInfo, model: Model) -> bool:
    """Ready (loaded, running, not deleting), labelled awake, and listed awake by the operator
    in the model's status: the label alone is writable by anyone with rights on the pod."""
    return (
        pod.ready
        and pod.state is EngineState.AWAKE
        and pod.ip is not None
        and model.vouched_awake(pod)
    )


@dataclass(frozen=True, kw_only=True)
class Claim:
    """Who serves a model name: one holder, or why there is none."""

    holder: Model | None
    claimants: int
    """Models whose status claims the name with no `Conflict`: more than one is a clash the
    operator has not settled yet."""
    named: bool
    """Some model's spec or status names it: it is known, if not (yet) served."""


def resolve(name: str, models: Iterable[Model]) -> Claim:
    """Pure: the model a name is routed to. Only a model whose status claims the name and
    has no `Conflict` may hold it, and only while it is the only one."""
    known = [m for m in models if name in (m.model_name, m.claimed_name)]
    holders = [m for m in known if m.holds(name)]
    return Claim(
        holder=holders[0] if len(holders) == 1 else None,
        claimants=len(holders),
        named=bool(known),
    )


class Departures:
    """Pods gone within the last POD_RETURN_SECONDS, oldest first; older ones are forgotten at
    each use, so that they cost at most what went in that time."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._gone: dict[Key, tuple[PodInfo, float]] = {}

    def add(self, pod: PodInfo) -> None:
        key = (pod.namespace, pod.name)
        self._gone.pop(key, None)  # gone again: now the newest
        self._gone[key] = (pod, self._clock())
        self._forget_old()

    def left(self, namespace: str, selector: LabelSelector) -> float:
        """Seconds for which a pod of `namespace` that `selector` selects, gone lately, still
        counts as coming back; 0 when none does."""
        now = self._forget_old()
        ages = [
            now - at
            for (ns, _), (pod, at) in self._gone.items()
            if ns == namespace and selector.matches(pod.labels)
        ]
        return POD_RETURN_SECONDS - min(ages) if ages else 0.0

    def _forget_old(self) -> float:
        now = self._clock()
        while self._gone:
            key, (_, at) = next(iter(self._gone.items()))
            if now - at < POD_RETURN_SECONDS:
                break
            del self._gone[key]
        return now


class Registry:
    """Models and pods by (namespace, name); every change wakes the coroutines that wait on it.

    It is fed only by the watchers (one loop), so it needs no locks. Models are indexed by
    the names they ask for and claim, pods by label: a request's lookups cost what they find,
    not the fleet (scanning every pod and model per request took two thirds of the gateway's
    CPU at 2,500 models, and saturated it at 10,000).
    """

    def __init__(
        self,
        *,
        scopes: Iterable[str | None],
        on_pod_gone: Callable[[str, str], None] = lambda namespace, name: None,
        on_model_gone: Callable[[Key], None] = lambda key: None,
        on_pod_relabelled: Callable[[str, str], None] = lambda namespace, name: None,
    ) -> None:
        self.models: dict[Key, Model] = {}
        self.pods: dict[Key, PodInfo] = {}
        self._pod_index = PodIndex()
        self._departures = Departures()
        self._by_name: Index[str, Model] = Index()
        self._on_pod_gone = on_pod_gone
        """Told of each pod that is gone (deleted, or missing from a fresh list)."""
        self._on_model_gone = on_model_gone
        """Told of each model that is gone, likewise."""
        self._on_pod_relabelled = on_pod_relabelled
        """Told of each pod whose published state (its snooze.dev/state label) changed."""
        # Each (kind, namespace scope) must be listed once before the gateway is ready.
        self._unlisted = {(kind, scope) for kind in (MODELS, PODS) for scope in scopes}
        self._changed = asyncio.Event()
        self.crd_missing = False
        """The API said it serves no InferenceModels (their CRD is not installed)."""

    @property
    def ready(self) -> bool:
        return not self._unlisted

    def replace(self, kind: str, scope: str | None, items: Iterable[Mapping[str, Any]]) -> None:
        """A fresh list of `kind` in `scope` (None: all namespaces) replaces what was known."""
        store: dict[Key, Any] = self.models if kind == MODELS else self.pods
        before = {k: v for k, v in store.items() if scope is None or k[0] == scope}
        for key in before:
            self._drop(kind, key)
        for item in items:
            self._put(kind, item, before.get(key_of(item)))
        for key, known in before.items():
            if key not in store:
                self._gone(kind, key, known)
        self._unlisted.discard((kind, scope))
        self._notify()

    def apply(self, kind: str, event_type: str, obj: Mapping[str, Any]) -> None:
        """One watch event (ADDED, MODIFIED, DELETED)."""
        if event_type == "DELETED":
            key = key_of(obj)
            known = self._drop(kind, key)
            if known is not None:
                self._gone(kind, key, known)
        elif event_type in ("ADDED", "MODIFIED"):
            self._put(kind, obj)
        self._notify()

    def _gone(self, kind: str, key: Key, known: Model | PodInfo) -> None:
        if isinstance(known, PodInfo):
            self._departures.add(known)
            self._on_pod_gone(*key)
        else:
            self._on_model_gone(key)

    def note_model(self, body: Mapping[str, Any]) -> None:
        """An object this gateway just wrote: known before its watch event arrives."""
        self.apply(MODELS, "MODIFIED", body)

    def _put(
        self, kind: str, obj: Mapping[str, Any], listed_before: Model | PodInfo | None = None
    ) -> None:
        """Keep one object; `listed_before` is what was known of it before a fresh list
        dropped it (its relabelling is told as a watch event's would be)."""
        if kind == MODELS:
            model = model_from(obj)
            self.models[model.key] = model
            names = (model.model_name, model.claimed_name)
            self._by_name.put(model.key, {name: model for name in names if name})
        else:
            pod = pod_info(obj)
            before = self.pods.get((pod.namespace, pod.name))
            if before is None and isinstance(listed_before, PodInfo):
                before = listed_before
            self.pods[(pod.namespace, pod.name)] = pod
            self._pod_index.put(pod)
            if before is not None and before.state is not pod.state:
                self._on_pod_relabelled(pod.namespace, pod.name)

    def _drop(self, kind: str, key: Key) -> Model | PodInfo | None:
        """Forget one object; what was known of it."""
        if kind == MODELS:
            self._by_name.remove(key)
            return self.models.pop(key, None)
        self._pod_index.remove(key)
        return self.pods.pop(key, None)

    def poke(self) -> None:
        """Wake every waiter, as a change would."""
        self._notify()

    def _notify(self) -> None:
        # Swap, then set: a waiter that re-checks after this change waits for the next one.
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def wait_change(self, seconds: float) -> None:
        """Return at the next change, or after `seconds`."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), seconds)

    def resolve(self, model_name: str) -> Claim:
        """Who serves the name clients call `model_name` (see `resolve`)."""
        return resolve(model_name, self._by_name.get(model_name))

    def names(self) -> list[str]:
        """Every model name known, each once: claimed on a status or asked for in a spec."""
        found = {m.model_name for m in self.models.values()}
        found.update(m.claimed_name for m in self.models.values() if m.claimed_name)
        return sorted(found)

    def get(self, key: Key) -> Model | None:
        return self.models.get(key)

    def pods_of(self, model: Model) -> list[PodInfo]:
        if model.spec is None:
            return []
        return self._pod_index.selected(model.namespace, model.spec.selector)

    def coming_back(self, model: Model) -> float:
        """Seconds for which a pod of the model that went lately still counts as coming back
        (POD_RETURN_SECONDS); 0 when none does."""
        if model.spec is None:
            return 0.0
        return self._departures.left(model.namespace, model.spec.selector)

    def awake_pods(self, model: Model) -> list[PodInfo]:
        return [pod for pod in self.pods_of(model) if routable(pod, model)]
