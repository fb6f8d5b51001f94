"""The gateway's registry: models and pods from lists and watch events, re-listed after a drop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from snooze.gateway.registry import MODELS, PODS, Registry, model_from
from snooze.gateway.watch import follow


def model(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": name},
        "spec": {"selector": {"matchLabels": {"app": name}}, **spec},
    }


def pod(name: str, app: str, state: str = "awake", *, ready: bool = True) -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": "ns",
            "name": name,
            "labels": {"app": app, "snooze.dev/state": state},
        },
        "status": {
            "phase": "Running",
            "podIP": "127.0.0.9",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def test_routes_only_to_ready_pods_labelled_awake() -> None:
    registry = Registry(scopes=[None])
    registry.replace(MODELS, None, [model("chat", modelName="llama")])
    registry.replace(
        PODS,
        None,
        [
            pod("p0", "chat"),
            pod("p1", "chat", "asleep"),
            pod("p2", "chat", ready=False),
            pod("p3", "chat", "draining"),
            pod("other", "else"),
        ],
    )
    assert registry.ready
    found = registry.find("llama")
    assert found is not None and registry.find("chat") is None
    assert [p.name for p in registry.awake_pods(found)] == ["p0"]
    assert len(registry.pods_of(found)) == 4
    registry.apply(PODS, "DELETED", pod("p0", "chat"))
    assert registry.awake_pods(found) == []


def test_refusals_say_what_to_change() -> None:
    assert model_from(model("a")).refusal() is None
    assert "desiredState" in (model_from(model("a", desiredState="Asleep")).refusal() or "")
    assert "onRequest" in (model_from(model("a", wake={"onRequest": False})).refusal() or "")
    invalid = model_from({"metadata": {"namespace": "ns", "name": "bad"}, "spec": {}})
    assert invalid.phase == "Invalid" and "selector" in (invalid.refusal() or "")


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
        for _ in range(100):
            if len(registry.pods) == 2:
                break
            await asyncio.sleep(0.02)
        assert sorted(name for _, name in registry.pods) == ["p0", "p1"]
        assert api.watches == 2
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
