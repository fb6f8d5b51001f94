"""The gateway's registry: models and pods from lists and watch events, re-listed after a drop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import builders
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from waits import until

from snooze.gateway.models.model import model_from
from snooze.gateway.models.registry import (
    MODELS,
    POD_RETURN_SECONDS,
    PODS,
    Departures,
    Registry,
    resolve,
)
from snooze.gateway.models.watch import follow
from snooze.kube.pods import pod_info


def model(
    name: str,
    *,
    namespace: str = "ns",
    status: dict[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """The builders' model in namespace ns, with a status (empty unless given)."""
    return builders.model(name, namespace=namespace, status=status or {}, **spec)


def claims(name: str, pods: dict[str, str], *, conflict: bool | None = None) -> dict[str, Any]:
    """A status as the operator writes it: the name it routes by, pods, maybe a Conflict (with
    every field the CRD requires of a condition)."""
    conditions = []
    if conflict is not None:
        conditions.append(
            {"type": "Conflict", "status": str(conflict), "reason": "ModelNameTaken",
             "message": "taken", "lastTransitionTime": "2026-01-01T00:00:00Z"}
        )  # fmt: skip
    return {
        "modelName": name,
        "pods": [{"name": p, "state": s, "uid": f"uid-{p}"} for p, s in pods.items()],
        "conditions": conditions,
    }


def pod(name: str, app: str, state: str = "awake", *, ready: bool = True) -> dict[str, Any]:
    """The builders' pod of model `app`, running, in this engine state (the tests' axes)."""
    return builders.pod(
        name=name,
        namespace="ns",
        uid=f"uid-{name}",
        labels={"app": app, "snooze.dev/state": state},
        status=builders.running("127.0.0.9", {"type": "Ready", "status": str(ready)}),
    )


def test_routes_only_to_ready_pods_labelled_and_reported_awake() -> None:
    registry = Registry(scopes=[None])
    status = claims(
        "llama", {"p0": "awake", "p1": "awake", "p2": "awake", "p3": "awake", "p4": "asleep"}
    )
    registry.replace(MODELS, None, [model("chat", modelName="llama", status=status)])
    registry.replace(
        PODS,
        None,
        [
            pod("p0", "chat"),
            pod("p1", "chat", "asleep"),
            pod("p2", "chat", ready=False),
            pod("p3", "chat", "draining"),
            pod("p4", "chat"),  # labelled awake by someone, asleep on the status
            pod("p5", "chat"),  # labelled awake, absent from the status
            pod("other", "else"),
        ],
    )
    assert registry.ready
    found = registry.resolve("llama").holder
    assert found is not None and not registry.resolve("chat").named
    assert [p.name for p in registry.awake_pods(found)] == ["p0"]
    assert len(registry.pods_of(found)) == 6
    # A pod recreated under p0's name has another uid: the status entry is not about it.
    registry.apply(
        PODS,
        "MODIFIED",
        {**pod("p0", "chat"), "metadata": {**pod("p0", "chat")["metadata"], "uid": "uid-new"}},
    )
    assert registry.awake_pods(found) == []
    registry.apply(PODS, "MODIFIED", pod("p0", "chat"))
    registry.apply(PODS, "DELETED", pod("p0", "chat"))
    assert registry.awake_pods(found) == []


@pytest.mark.parametrize(
    ("statuses", "holder", "claimants", "named"),
    [
        ({"a": None, "b": None}, None, 0, True),  # asked for in specs, claimed by no status
        ({"a": claims("llm", {}), "b": None}, "a", 1, True),  # one claims it
        ({"a": claims("llm", {}), "b": claims("llm", {})}, None, 2, True),  # a clash
        (
            {"a": claims("llm", {}, conflict=False), "b": claims("llm", {}, conflict=True)},
            "a",
            1,
            True,
        ),
        ({"a": claims("llm", {}, conflict=True), "b": None}, None, 0, True),  # holder gone
        ({"a": claims("other", {}), "b": claims("other", {})}, None, 0, True),  # spec only
    ],
)
def test_a_name_goes_only_to_the_one_model_whose_status_holds_it(
    statuses: dict[str, dict[str, Any] | None], holder: str | None, claimants: int, named: bool
) -> None:
    models = [
        model_from(model("m", namespace=ns, modelName="llm", status=status))
        for ns, status in statuses.items()
    ]
    claim = resolve("llm", models)
    assert (claim.holder.namespace if claim.holder else None) == holder
    assert (claim.claimants, claim.named) == (claimants, named)
    assert not resolve("unknown", models).named


def test_refusals_say_what_to_change() -> None:
    assert model_from(model("a")).refusal() is None
    assert "desiredState" in (model_from(model("a", desiredState="Asleep")).refusal() or "")
    assert "onRequest" in (model_from(model("a", wake={"onRequest": False})).refusal() or "")
    invalid = model_from({"metadata": {"namespace": "ns", "name": "bad"}, "spec": {}})
    assert invalid.phase == "Invalid" and "selector" in (invalid.refusal() or "")


def test_a_pod_gone_counts_as_coming_back_for_a_while() -> None:
    """Its controller may be recreating it: for POD_RETURN_SECONDS after the last one of a
    selector went, and only for that selector's namespace."""
    now = [100.0]
    departures = Departures(clock=lambda: now[0])
    chat = model_from(model("chat"))
    assert chat.spec is not None
    selector = chat.spec.selector
    assert departures.left("ns", selector) == 0.0
    departures.add(pod_info(pod("p0", "chat")))
    now[0] += 4
    departures.add(pod_info(pod("p1", "chat")))
    departures.add(pod_info(pod("other", "else")))
    now[0] += 1
    assert departures.left("ns", selector) == POD_RETURN_SECONDS - 1
    assert departures.left("elsewhere", selector) == 0.0
    now[0] += POD_RETURN_SECONDS
    assert departures.left("ns", selector) == 0.0

    # The registry counts a pod deleted, or missing from a fresh list, as gone; not one that
    # a fresh list still holds.
    registry = Registry(scopes=[None])
    registry.replace(MODELS, None, [model("chat")])
    registry.replace(PODS, None, [pod("p0", "chat"), pod("p1", "chat")])
    registry.replace(PODS, None, [pod("p0", "chat"), pod("p1", "chat")])
    assert registry.coming_back(chat) == 0.0
    registry.replace(PODS, None, [pod("p0", "chat")])
    assert registry.coming_back(chat) > POD_RETURN_SECONDS - 1
    registry.apply(PODS, "DELETED", pod("p0", "chat"))
    assert registry.pods_of(chat) == [] and registry.coming_back(chat) > 0


def test_a_status_field_it_cannot_read_is_dropped_and_the_rest_kept() -> None:
    """Read as the operator reads it (parse_status): a field of the wrong type, from an older
    or newer release, costs that field alone, never the model's routing."""
    status = claims("llm", {"p0": "awake"}, conflict=False)
    status.update(lastWakeSeconds="soon", phase="Sleepy", scaledToZeroTime="2026-01-01T00:00:00Z")
    status["pods"][0]["since"] = "yesterday"
    read = model_from(model("chat", status=status))
    assert read.holds("llm") and read.conflict is None
    assert read.status_pods["p0"].state == "awake" and read.status_pods["p0"].uid == "uid-p0"
    assert read.last_wake_seconds is None and read.phase == "Pending"
    assert read.scaled_to_zero_at == 1767225600.0


class FlakyApi:
    """Lists what it is given; its first watch drops after one event, the second never ends."""

    def __init__(self) -> None:
        self.lists = [[pod("p0", "chat")], [pod("p0", "chat"), pod("p1", "chat")]]
        self.watches = 0

    async def list(self, ref: Any) -> dict[str, Any]:
        items = self.lists.pop(0) if len(self.lists) > 1 else self.lists[0]
        return {"metadata": {"resourceVersion": "1"}, "items": items}

    async def watch(self, ref: Any, **_: Any) -> AsyncIterator[dict[str, Any]]:
        self.watches += 1
        if self.watches == 1:
            yield {"type": "MODIFIED", "object": pod("p0", "chat", "asleep")}
            raise ConnectionError("the watch dropped")
        await asyncio.Event().wait()
        yield {}


async def test_a_dropped_watch_is_followed_by_a_fresh_list() -> None:
    registry = Registry(scopes=[None])
    api = FlakyApi()
    task = asyncio.create_task(
        follow(api, registry, kind=PODS, scope=None, watch_seconds=1)  # type: ignore[arg-type]
    )
    try:
        await until(lambda: len(registry.pods) == 2, 2.0)
        assert sorted(name for _, name in registry.pods) == ["p0", "p1"]
        assert api.watches == 2
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


NAMES = st.sampled_from(["a", "b", "c"])
SPACES = st.sampled_from(["ns", "other"])
LABEL_SETS = st.dictionaries(
    st.sampled_from(["app", "tier"]), st.sampled_from(["a", "b"]), max_size=2
)
EVENTS = st.one_of(
    st.tuples(st.just("model"), SPACES, NAMES, NAMES, st.one_of(st.none(), NAMES), LABEL_SETS),
    st.tuples(st.just("pod"), SPACES, NAMES, LABEL_SETS),
    st.tuples(st.just("delete"), st.sampled_from([MODELS, PODS]), SPACES, NAMES),
    st.tuples(st.just("relist"), st.sampled_from([MODELS, PODS]), SPACES),
)


@given(st.lists(EVENTS, max_size=40))
@example(  # a deleted pod and a renamed model must leave the indexes too
    [
        ("model", "ns", "m", "a", "b", {"app": "a"}),
        ("pod", "ns", "p", {"app": "a"}),
        ("delete", PODS, "ns", "p"),
        ("model", "ns", "m", "c", None, {"app": "a"}),
    ]
)
def test_indexed_lookups_answer_as_a_scan_of_everything(events: list[tuple[Any, ...]]) -> None:
    # Lookups go through indexes by name and by label; whatever the order of events, they must
    # find what scanning every model and pod would.
    registry = Registry(scopes=["ns", "other"])
    for event in events:
        if event[0] == "model":
            _, namespace, name, asked, claimed, labels = event
            selector = (
                {"matchLabels": labels}
                if labels
                else {"matchExpressions": [{"key": "tier", "operator": "Exists"}]}
            )
            body = model(
                name,
                namespace=namespace,
                status={"modelName": claimed} if claimed else None,
                modelName=asked,
                selector=selector,
            )
            registry.apply(MODELS, "MODIFIED", body)
        elif event[0] == "pod":
            _, namespace, name, labels = event
            body = pod(name, "x")
            body["metadata"].update(namespace=namespace, labels=labels)
            registry.apply(PODS, "ADDED", body)
        elif event[0] == "delete":
            _, kind, namespace, name = event
            registry.apply(kind, "DELETED", {"metadata": {"namespace": namespace, "name": name}})
        else:  # a fresh list of one namespace: what it had, less its first object
            _, kind, namespace = event
            store: dict[Any, Any] = registry.models if kind == MODELS else registry.pods
            kept = sorted(k for k in store if k[0] == namespace)[1:]
            if kind == MODELS:
                items = [model(k[1], namespace=k[0], modelName="a") for k in kept]
            else:  # the pods lost their labels meanwhile
                items = [{"metadata": {"namespace": k[0], "name": k[1]}} for k in kept]
            registry.replace(kind, namespace, items)
    for name in ["a", "b", "c"]:
        assert registry.resolve(name) == resolve(name, registry.models.values())
    for known in registry.models.values():
        assert known.spec is not None
        scanned = [
            p
            for (namespace, _), p in registry.pods.items()
            if namespace == known.namespace and known.spec.selector.matches(p.labels)
        ]
        assert sorted(registry.pods_of(known), key=lambda p: p.name) == sorted(
            scanned, key=lambda p: p.name
        )


def test_a_pod_relabelled_is_told_and_no_other_change_is() -> None:
    told: list[tuple[str, str]] = []
    registry = Registry(
        scopes=[None], on_pod_relabelled=lambda namespace, name: told.append((namespace, name))
    )
    registry.apply(PODS, "ADDED", pod("chat-0", "chat"))
    registry.apply(PODS, "MODIFIED", pod("chat-0", "chat", ready=False))
    assert told == []
    registry.apply(PODS, "MODIFIED", pod("chat-0", "chat", "asleep", ready=False))
    assert told == [("ns", "chat-0")]
    # A fresh list after a watch was lost tells of what changed meanwhile, as events would.
    registry.replace(PODS, None, [pod("chat-0", "chat", "asleep")])
    assert told == [("ns", "chat-0")]
    registry.replace(PODS, None, [pod("chat-0", "chat", "awake")])
    assert told == [("ns", "chat-0"), ("ns", "chat-0")]
