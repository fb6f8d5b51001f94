"""The operator's kopf handlers: the registry wires each with the id the operator's state names,
every one a resource's event runs is async (so it runs in the operator's event loop: kopf runs
a sync handler in a thread, where setting a loop's asyncio.Event can lose the wakeup), and
each is a function of its module, called here as kopf calls it, with the memo."""

from __future__ import annotations

import asyncio
import collections
from typing import Any, cast

import kopf

from snooze.engine.client import EngineHttp
from snooze.engine.probe import Prober
from snooze.kube.api import KubeApi
from snooze.operator.events.recorder import EventRecorder
from snooze.operator.handlers.model import model_changed
from snooze.operator.handlers.pod import pod_changed
from snooze.operator.handlers.registry import build_registry
from snooze.operator.indexes import Indexes
from snooze.operator.metrics import OperatorMetrics
from snooze.operator.model.loop import ModelLoop
from snooze.operator.pool.loop import PoolHub
from snooze.operator.runtime import Memo, Runtime, Started
from snooze.operator.settings import Settings
from snooze.operator.traffic.gateways import GatewayTraffic

# What the handlers under test never call (no I/O happens in them): the clients.
UNUSED_API = cast(KubeApi, None)


def test_every_resource_handler_runs_in_the_event_loop() -> None:
    registry = build_registry()
    handlers = [
        *registry._watching.get_all_handlers(),
        *registry._spawning.get_all_handlers(),
        *registry._changing.get_all_handlers(),
    ]
    ids = sorted(h.id for h in handlers)
    assert ids == sorted(
        ["pod_changed", "model_changed", "pool_changed", "model", "pool", "hand_back"]
    )
    sync = [h.id for h in handlers if not asyncio.iscoroutinefunction(h.fn)]
    assert not sync, f"handlers kopf would run in a thread: {sync}"


def test_the_operator_starts_and_stops_in_the_event_loop() -> None:
    registry = build_registry()
    by_id = {str(h.id): h for h in registry._activities.get_all_handlers()}
    assert set(by_id) == {"login", "startup", "cleanup"}
    assert asyncio.iscoroutinefunction(by_id["startup"].fn)
    assert asyncio.iscoroutinefunction(by_id["cleanup"].fn)


def model_body(name: str, app: str, generation: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "default", "generation": generation},
        "spec": {"selector": {"matchLabels": {"app": app}}},
    }


def pod_body(name: str, app: str, state: str = "awake") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"uid-{name}",
            "labels": {"app": app, "snooze.dev/state": state},
        },
        "status": {"podIP": "10.0.0.7", "conditions": [{"type": "Ready", "status": "True"}]},
    }


def loop_of(body: dict[str, Any], settings: Settings) -> ModelLoop:
    return ModelLoop(
        namespace="default",
        name=body["metadata"]["name"],
        body=body,
        pods=lambda _: [],
        api=UNUSED_API,
        prober=cast(Prober, None),
        action_http=cast(EngineHttp, None),
        settings=settings,
        emit=lambda *_: None,
        metrics=OperatorMetrics(),
    )


def memo_with(*bodies: dict[str, Any]) -> tuple[Memo, dict[str, ModelLoop]]:
    """A memo as start-up leaves it, with these models filed and their loops running."""
    settings = Settings()
    memo = Memo(Runtime(settings=settings))
    indexes = Indexes()
    memo.started = Started(
        api=UNUSED_API,
        recorder=cast(EventRecorder, None),
        prober=cast(Prober, None),
        action_http=cast(EngineHttp, None),
        gateways=GatewayTraffic(api=None, interval=1.0),
        pickers=None,
        pools=PoolHub(),
        indexes=indexes,
        models=collections.Counter(),
    )
    loops = {}
    for body in bodies:
        indexes.model(body)
        loops[body["metadata"]["name"]] = loop = loop_of(body, settings)
        memo.started.add_loop(("default", body["metadata"]["name"]), loop)
    return memo, loops


def poked(loops: dict[str, ModelLoop]) -> list[str]:
    """The loops poked since the last look, which is cleared."""
    names = sorted(name for name, loop in loops.items() if loop.memory.poke.is_set())
    for loop in loops.values():
        loop.memory.poke.clear()
    return names


async def test_a_pod_change_pokes_the_loops_of_the_models_that_select_it_or_did() -> None:
    memo, loops = memo_with(model_body("chat", "chat"), model_body("code", "code"))

    async def event(body: dict[str, Any]) -> None:
        await pod_changed(
            body=kopf.Body(body), event={"type": "MODIFIED"}, namespace="default", memo=memo
        )

    await event(pod_body("p-0", "chat"))
    assert poked(loops) == ["chat"]
    # The operator's own state label, written back by the watch: nothing to look at again.
    await event(pod_body("p-0", "chat", state="asleep"))
    assert poked(loops) == []
    # Relabelled to the other model: the one that selected it looks again, and the new one.
    await event(pod_body("p-0", "code"))
    assert poked(loops) == ["chat", "code"]


async def test_a_model_change_pokes_its_loop_but_its_own_status_write_does_not() -> None:
    memo, loops = memo_with(model_body("chat", "chat"), model_body("code", "code"))

    async def event(body: dict[str, Any]) -> None:
        await model_changed(
            body=kopf.Body(body), namespace="default", name="chat", memo=memo, type="MODIFIED"
        )

    await event(model_body("chat", "chat"))  # its first sighting
    assert poked(loops) == ["chat"]
    status_written = {**model_body("chat", "chat"), "status": {"phase": "Awake"}}
    await event(status_written)
    assert poked(loops) == []
    await event(model_body("chat", "chat", generation=2))  # its spec changed
    assert poked(loops) == ["chat"]
