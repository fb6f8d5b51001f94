"""What every handler of one operator shares, through kopf's memo: what the process starts
with (Runtime), what each start-up of kopf makes (Started), and how a daemon runs its loop
until kopf stops it."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from collections.abc import Awaitable, Callable

import kopf

from snooze.engine.client import EngineHttp
from snooze.engine.probe import Prober
from snooze.kube.api import KubeApi
from snooze.operator.events.recorder import EventRecorder
from snooze.operator.indexes import Indexes, ModelSightings
from snooze.operator.metrics import OperatorMetrics
from snooze.operator.model.loop import ModelLoop
from snooze.operator.pool.loop import PoolHub
from snooze.operator.settings import Settings
from snooze.operator.sightings import PodSighting
from snooze.operator.traffic.gateways import GatewayTraffic
from snooze.operator.traffic.pickers import PickerQueues

Key = tuple[str, str]
"""An object's (namespace, name)."""


@dataclasses.dataclass
class Runtime:
    """What the operator's process starts with, before kopf runs: its settings and metrics,
    the namespaces it watches, and how to make kopf start again."""

    settings: Settings
    metrics: OperatorMetrics = dataclasses.field(default_factory=OperatorMetrics)
    namespaces: tuple[str, ...] = ()
    """The namespaces (or patterns) kopf watches; none: all."""
    restart: Callable[[], None] = lambda: None
    """Stop kopf so that it starts again and sees resources installed since (runner.py sets
    it before each run)."""


@dataclasses.dataclass(kw_only=True)
class Started:
    """What one start-up of kopf makes (handlers/lifecycle.py), for every handler of that run:
    the clients, the Events' recorder, the first reads, and the loops that run."""

    api: KubeApi
    recorder: EventRecorder
    """Writes the Events (events/recorder.py), with the API client."""
    prober: Prober
    """Every model's probes, over one aiohttp session with one bound for the operator."""
    action_http: EngineHttp
    """For sleeps and wakes, which take seconds to minutes: kept apart so that a wave of
    them never holds up the probes' slots."""
    gateways: GatewayTraffic
    """The gateway's per-engine counters, scraped every probe interval (if it is given)."""
    pickers: PickerQueues | None
    """The Inference Extension's endpoint pickers, read when --inference-gateway is given."""
    pools: PoolHub
    """The pool loops, and what they read of the gateways: made with this run's gateways,
    before any loop starts."""
    indexes: Indexes
    """Pods and models as the first reads, then the watch events, showed them (indexes.py)."""
    models: collections.Counter[str]
    """The model loops running, per namespace: the weight of its write budget."""
    tasks: list[asyncio.Task[None]] = dataclasses.field(default_factory=list)
    """What start-up started beside kopf (the scrapes of the gateways and pickers, the watch
    of a CRD not installed yet): cancelled at cleanup."""
    loops: dict[Key, ModelLoop] = dataclasses.field(default_factory=dict)
    routing: dict[Key, PodSighting] = dataclasses.field(default_factory=dict)
    """What of each pod last poked its models' loops (handlers/pod.py)."""
    sightings: ModelSightings = dataclasses.field(default_factory=ModelSightings)
    """What of each model last poked its loop and its neighbours (handlers/model.py)."""
    closing: bool = False
    """kopf is stopping: a daemon that it still spawns from a late event ends at once."""

    def add_loop(self, key: Key, loop: ModelLoop) -> None:
        self.loops[key] = loop
        self.models[key[0]] += 1

    def remove_loop(self, key: Key) -> None:
        if self.loops.pop(key, None) is not None:
            self.models[key[0]] -= 1


class Memo:
    """kopf's memo for one run of kopf (runner.py makes it). kopf hands this memo itself to the
    start-up and cleanup handlers, and to each object's handlers a shallow copy, made when it
    first sees the object: after start-up, since it watches nothing before. So every handler
    of the run reads the same Runtime and the same Started."""

    started: Started
    """Set by the start-up handler, before kopf runs any other (kopf's reactor runs the
    start-up first, and cleanup only after a start-up that succeeded)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime


async def until_stopped(
    run: Callable[[Callable[[], bool]], Awaitable[None]],
    poke: Callable[[], None],
    stopped: kopf.DaemonStopped,
    started: Started,
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
        await run(lambda: bool(stopped) or started.closing)
    finally:
        waker.cancel()
