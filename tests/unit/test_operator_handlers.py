"""The operator's kopf registry: every handler a resource's event or change runs is async, so it
runs in the operator's event loop (kopf runs a sync handler in a thread, where setting a
loop's asyncio.Event can lose the wakeup), and each has the id the operator's state names."""

from __future__ import annotations

import asyncio

from snooze.operator.handlers.registry import build_registry
from snooze.operator.runtime import Runtime
from snooze.operator.settings import Settings


def test_every_resource_handler_runs_in_the_event_loop() -> None:
    registry = build_registry(Runtime(settings=Settings()))
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
    registry = build_registry(Runtime(settings=Settings()))
    by_id = {str(h.id): h for h in registry._activities.get_all_handlers()}
    assert set(by_id) == {"login", "startup", "cleanup"}
    assert asyncio.iscoroutinefunction(by_id["startup"].fn)
    assert asyncio.iscoroutinefunction(by_id["cleanup"].fn)
