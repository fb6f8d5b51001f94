"""In-memory indexes of watched objects, so that a lookup costs what it finds, not the fleet.

The operator and the gateway both answer "which pods does this model select" many times a
second; scanning every pod for it made each lookup cost the whole fleet (at 2,500 models,
two thirds of the gateway's CPU went to that scan: benchmarks/README.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Generic, TypeVar

from snooze.api.models import LabelSelector
from snooze.kube.pods import PodInfo

K = TypeVar("K")
V = TypeVar("V")
Object = tuple[str, str]
"""(namespace, name) of the object an entry came from."""
LabelKey = tuple[str, str, str]
"""(namespace, label key, label value)."""


class Index(Generic[K, V]):
    """Values by key; each object files its values under keys of its own, replaced whole at
    each change of the object (as kopf's indexes)."""

    def __init__(self) -> None:
        self._by_key: dict[K, dict[Object, V]] = {}
        self._keys_of: dict[Object, list[K]] = {}

    def put(self, obj: Object, entries: Mapping[K, V]) -> None:
        self.remove(obj)
        for key, value in entries.items():
            self._by_key.setdefault(key, {})[obj] = value
        self._keys_of[obj] = list(entries)

    def remove(self, obj: Object) -> None:
        for key in self._keys_of.pop(obj, []):
            bucket = self._by_key.get(key)
            if bucket is not None:
                bucket.pop(obj, None)
                if not bucket:
                    del self._by_key[key]

    def get(self, key: K, default: Sequence[V] = ()) -> list[V]:
        bucket = self._by_key.get(key)
        return list(bucket.values()) if bucket else list(default)


class PodIndex:
    """Pods by namespace and by each of their labels."""

    def __init__(self) -> None:
        self.by_namespace: Index[str, PodInfo] = Index()
        self.by_label: Index[LabelKey, PodInfo] = Index()

    def put(self, pod: PodInfo) -> None:
        obj = (pod.namespace, pod.name)
        self.by_namespace.put(obj, {pod.namespace: pod})
        self.by_label.put(
            obj, {(pod.namespace, key, value): pod for key, value in pod.labels.items()}
        )

    def remove(self, obj: Object) -> None:
        self.by_namespace.remove(obj)
        self.by_label.remove(obj)

    def candidates(self, namespace: str, selector: LabelSelector) -> list[PodInfo]:
        """The pods of a namespace the selector may select: those under its first matchLabels
        pair (a pod it selects carries them all), or, without matchLabels, all the
        namespace's. The caller applies the whole selector."""
        if selector.match_labels:
            key, value = min(selector.match_labels.items())
            return self.by_label.get((namespace, key, value))
        return self.by_namespace.get(namespace)

    def selected(self, namespace: str, selector: LabelSelector) -> list[PodInfo]:
        """The pods of a namespace the selector selects."""
        return [p for p in self.candidates(namespace, selector) if selector.matches(p.labels)]
