"""The operator's own indexes of pods and models: an object's entries are replaced whole at
each change and dropped at its deletion; the start-up list fills them from the API, in the
namespaces kopf watches."""

from __future__ import annotations

import asyncio
from typing import Any

import builders

from snooze.kube.api import NotFound, Ref
from snooze.operator.indexes import Indexes, candidates


# The indexes' axes: a name, a namespace and labels (the pod's, or those the model selects).
def pod(name: str, namespace: str = "ns", **labels: str) -> dict[str, Any]:
    return builders.pod(name=name, namespace=namespace, uid=name, labels=labels)


def model(name: str, namespace: str = "ns", **match: str) -> dict[str, Any]:
    return builders.model(name, namespace=namespace, match_labels=match, modelName=f"{name}-model")


def test_a_pod_moves_between_labels_and_leaves_at_deletion() -> None:
    indexes = Indexes()
    indexes.pod(pod("chat-0", app="chat", tier="a"))
    assert [p.name for p in indexes.pods.by_label.get(("ns", "app", "chat"))] == ["chat-0"]
    indexes.pod(pod("chat-0", app="chat", tier="b"))  # relabelled: the old entry goes
    assert indexes.pods.by_label.get(("ns", "tier", "a")) == []
    assert [p.name for p in indexes.pods.by_label.get(("ns", "tier", "b"))] == ["chat-0"]
    indexes.pod(pod("chat-0"), deleted=True)
    assert indexes.pods.by_namespace.get("ns") == []
    assert indexes.pods.by_label.get(("ns", "app", "chat")) == []


def test_models_file_their_claims_and_selectors() -> None:
    indexes = Indexes()
    indexes.model(model("chat", app="chat"))
    indexes.model(model("other", namespace="ns2", app="chat"))
    assert [c.name for c in indexes.claims.get("chat-model")] == ["chat"]
    assert [n for n, _ in candidates(indexes.selectors, "ns", {"app": "chat"})] == ["chat"]
    invalid = model("chat", app="chat") | {"spec": {"selector": "nonsense"}}
    indexes.model(invalid)  # an invalid spec claims and selects nothing
    assert indexes.claims.get("chat-model") == []
    assert candidates(indexes.selectors, "ns", {"app": "chat"}) == []
    indexes.model(model("other", namespace="ns2"), deleted=True)
    assert candidates(indexes.selectors, "ns2", {"app": "chat"}) == []


class Api:
    """Lists as the API would; no InferenceModel CRD in `missing`."""

    def __init__(self, objects: dict[str, list[dict[str, Any]]], missing: bool = False) -> None:
        self.objects, self.missing, self.paths = objects, missing, []  # type: ignore[var-annotated]

    async def list(self, ref: Ref, *, label_selector: str = "") -> dict[str, Any]:
        self.paths.append(ref.path)
        kind = "pods" if ref.path.endswith("/pods") else "models"
        if kind == "models" and self.missing:
            raise NotFound(f"GET {ref.path}: not found", status=404)
        items = [
            o
            for o in self.objects[kind]
            if f"/namespaces/{o['metadata']['namespace']}/" in ref.path
            or "/namespaces/" not in ref.path
        ]
        return {"items": items}


def test_a_spec_is_validated_again_only_when_it_changed(monkeypatch: Any) -> None:
    import snooze.api.models

    calls: list[dict[str, Any]] = []
    parse = snooze.api.models.parse_spec

    def counting(raw: dict[str, Any]) -> Any:
        calls.append(raw)
        return parse(raw)

    monkeypatch.setattr(snooze.api.models, "parse_spec", counting)
    indexes = Indexes()
    body = model("chat", app="chat")
    indexes.model(body)
    indexes.model({**body, "status": {"phase": "Awake"}})  # its own status write: no change
    assert len(calls) == 1
    body["spec"]["selector"]["matchLabels"] = {"app": "other"}  # changed in place, even
    _, selector = indexes.model(body)
    assert len(calls) == 2 and selector is not None
    assert selector.match_labels == {"app": "other"}
    body["spec"]["idle"] = {"after": "soon"}  # invalid: selects and claims nothing
    assert indexes.model(body) == (None, None)
    assert indexes.claims.get("chat-model") == []


def test_the_start_up_list_covers_what_kopf_watches() -> None:
    objects = {
        "pods": [pod("a-0", app="a"), pod("b-0", namespace="team-b", app="b")],
        "models": [model("a", app="a"), model("b", namespace="team-b", app="b")],
    }
    everything = Indexes()
    asyncio.run(everything.load(Api(objects)))  # type: ignore[arg-type]
    assert {p.name for ns in ("ns", "team-b") for p in everything.pods.by_namespace.get(ns)} == {
        "a-0",
        "b-0",
    }
    one = Indexes()
    api = Api(objects)
    asyncio.run(one.load(api, ["ns"]))  # type: ignore[arg-type]
    assert all("/namespaces/ns/" in path for path in api.paths)
    assert one.pods.by_namespace.get("team-b") == [] and one.claims.get("b-model") == []
    patterned = Indexes()
    asyncio.run(patterned.load(Api(objects), ["team-*"]))  # type: ignore[arg-type]
    assert [p.name for p in patterned.pods.by_namespace.get("team-b")] == ["b-0"]
    assert patterned.pods.by_namespace.get("ns") == []
    excluded = Indexes()  # kopf's exclusions: everything but team-*
    asyncio.run(excluded.load(Api(objects), ["!team-*"]))  # type: ignore[arg-type]
    assert [p.name for p in excluded.pods.by_namespace.get("ns")] == ["a-0"]
    assert excluded.pods.by_namespace.get("team-b") == []
    # Before the CRD is installed: the pods, and no model.
    early = Indexes()
    asyncio.run(early.load(Api(objects, missing=True)))  # type: ignore[arg-type]
    assert len(early.pods.by_namespace.get("ns")) == 1 and early.claims.get("a-model") == []
