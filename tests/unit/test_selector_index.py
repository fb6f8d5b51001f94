"""The models that may select a pod are found through an index of their selectors' labels,
without missing one: every model whose selector matches the pod is among the candidates."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from snooze.api.models import LabelSelector
from snooze.operator.indexes import candidates, selector_keys

LABELS = st.dictionaries(st.sampled_from("abc"), st.sampled_from("xyz"), max_size=3)


def selector(spec: dict[str, Any]) -> LabelSelector:
    return LabelSelector.model_validate(spec)


def index_of(models: dict[str, LabelSelector]) -> dict[Any, list[tuple[str, LabelSelector]]]:
    index: dict[Any, list[tuple[str, LabelSelector]]] = {}
    for name, sel in models.items():
        for key in selector_keys("ns", sel):
            index.setdefault(key, []).append((name, sel))
    return index


def test_a_pod_finds_the_models_of_its_labels_and_those_with_expressions_only() -> None:
    models = {
        "chat": selector({"matchLabels": {"app": "chat", "tier": "gpu"}}),
        "code": selector({"matchLabels": {"app": "code"}}),
        "any-gpu": selector({"matchExpressions": [{"key": "tier", "operator": "Exists"}]}),
    }
    index = index_of(models)
    found = candidates(index, "ns", {"app": "chat", "tier": "gpu"})  # type: ignore[arg-type]
    assert sorted(name for name, _ in found) == ["any-gpu", "chat"]
    assert candidates(index, "other", {"app": "chat"}) == []  # type: ignore[arg-type]


@given(st.dictionaries(st.sampled_from(["m1", "m2", "m3", "m4"]), LABELS, min_size=1), LABELS)
def test_no_model_that_selects_the_pod_is_missed(
    match_labels: dict[str, dict[str, str]], pod: dict[str, str]
) -> None:
    models = {
        name: selector(
            {"matchLabels": labels}
            if labels
            else {"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}
        )
        for name, labels in match_labels.items()
    }
    found = {name for name, _ in candidates(index_of(models), "ns", pod)}  # type: ignore[arg-type]
    assert {name for name, sel in models.items() if sel.matches(pod)} <= found
