"""Which Inference Extension pools serve a model: an InferencePool whose selector selects any of
the model's pods (or the pods its workload will make) in its namespace. Pure; labels and model
names are compared as the data they are, never parsed or joined."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol, TypeVar


class Selecting(Protocol):
    @property
    def selector(self) -> Mapping[str, str]: ...


P = TypeVar("P", bound=Selecting)


def selects(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    """Whether a pod with `labels` has every label of an InferencePool's selector (its
    matchLabels: a pool selects as a Service does, and one without labels selects all)."""
    return all(key in labels and labels[key] == value for key, value in selector.items())


def pools_serving(pools: Iterable[P], pods: Iterable[Mapping[str, str]]) -> list[P]:
    """The pools that select any of a model's pods (given by their labels)."""
    labels = list(pods)
    return [pool for pool in pools if any(selects(pool.selector, one) for one in labels)]
