"""What every handler of one operator shares (kept in kopf's memo), and how a daemon runs its
loop until kopf stops it."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

import kopf

from snooze.engine.probe import Prober
from snooze.kube.api import KubeApi
from snooze.operator.events.recorder import EventRecorder
from snooze.operator.indexes import Indexes
from snooze.operator.metrics import OperatorMetrics
from snooze.operator.model.loop import ModelLoop
from snooze.operator.pool.loop import PoolHub
from snooze.operator.settings import Settings
from snooze.operator.sightings import PodSighting
from snooze.operator.traffic.gateways import GatewayTraffic
from snooze.operator.traffic.pickers import PickerQueues


@dataclasses.dataclass
class Runtime:
    """What every handler shares, kept in kopf's memo."""

    settings: Settings
    metrics: OperatorMetrics = dataclasses.field(default_factory=OperatorMetrics)
    api: KubeApi | None = None
    gateways: GatewayTraffic | None = None
    """The gateway's per-engine counters, scraped every probe interval (if it is given)."""
    gateway_task: asyncio.Task[None] | None = None
    pickers: PickerQueues | None = None
    """The Inference Extension's endpoint pickers, read when --inference-gateway is given."""
    picker_task: asyncio.Task[None] | None = None
    prober: Prober | None = None
    """Every model's probes, over one aiohttp session with one bound for the operator."""
    action_http: Any = None
    """For sleeps and wakes, which take seconds to minutes: kept apart so that a wave of
    them never holds up the probes' slots."""
    restart: Callable[[], None] = lambda: None
    """Stop kopf so that it starts again and sees resources installed since (runner.py)."""
    crd_watch: asyncio.Task[None] | None = None
    """Polls discovery while a CRD (InferenceModel, GPUPool) is not installed."""
    closing: bool = False
    """kopf is stopping: a daemon that it still spawns from a late event ends at once."""
    loops: dict[tuple[str, str], ModelLoop] = dataclasses.field(default_factory=dict)
    pools: PoolHub = dataclasses.field(default_factory=PoolHub)
    """The pool loops, and what they read of the gateways: built again by each start-up, with
    that run's gateways (handlers/lifecycle.py), before any loop starts."""
    routing: dict[tuple[str, str], PodSighting] = dataclasses.field(default_factory=dict)
    namespaces: tuple[str, ...] = ()
    """The namespaces (or patterns) kopf watches; none: all."""
    indexes: Indexes = dataclasses.field(default_factory=Indexes)
    """Pods and models as the last watch events showed them (indexes.py)."""
    models: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    """The model loops running, per namespace: the weight of its write budget."""
    recorder: EventRecorder | None = None
    """Writes the Events (events/recorder.py): made at start-up, with the API client."""

    def add_loop(self, key: tuple[str, str], loop: ModelLoop) -> None:
        self.loops[key] = loop
        self.models[key[0]] += 1

    def remove_loop(self, key: tuple[str, str]) -> None:
        if self.loops.pop(key, None) is not None:
            self.models[key[0]] -= 1

    def events(self) -> EventRecorder:
        """The Events' recorder (a handler runs only once start-up made it)."""
        assert self.recorder is not None
        return self.recorder


async def until_stopped(
    run: Callable[[Callable[[], bool]], Awaitable[None]],
    poke: Callable[[], None],
    stopped: kopf.DaemonStopped,
    runtime: Runtime,
    name: str,
) -> None:
    """Run a daemon's loop until kopf stops it (or the operator closes). The loop waits for a
    poke between cycles: a stop must end that wait, or kopf cancels the daemon and warns on
    every deletion of its object."""

    async def wake_on_stop() -> None:
        await stopped.wait()
        poke()

    waker = asyncio.create_task(wake_on_stop(), name=f"stop-waker:{name}")
    try:
        await run(lambda: bool(stopped) or runtime.closing)
    finally:
        waker.cancel()
