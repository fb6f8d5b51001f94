"""The GPUPool handlers: one coordinating loop per pool, poked when its spec changes."""

from __future__ import annotations

from typing import Any

import kopf

from snooze.api import gpupool, models
from snooze.operator.events.teller import teller
from snooze.operator.model.loop import ModelLoop
from snooze.operator.pool.loop import PoolLoop
from snooze.operator.runtime import Runtime, until_stopped


def register(registry: kopf.OperatorRegistry, runtime: Runtime) -> None:
    """The pools' event handler and daemon, into `registry`."""

    @kopf.on.event(
        models.GROUP, models.VERSION, gpupool.PLURAL, id="pool_changed", registry=registry
    )
    async def pool_changed(namespace: str | None, name: str, **_: Any) -> None:
        # Its spec is read live by its loop: a change is acted on now, not at the next interval.
        # Async, as the other event handlers: kopf runs a sync one in a thread, where setting
        # the loop's asyncio.Event is unsafe (the wakeup can be lost).
        loop = runtime.pools.loops.get((namespace or "", name))
        if loop is not None:
            loop.poke()

    @kopf.daemon(
        models.GROUP,
        models.VERSION,
        gpupool.PLURAL,
        id="pool",
        registry=registry,
        # As for a model: a deleted pool's loop ends at its next wait, woken by the stop.
        cancellation_backoff=15.0,
        cancellation_timeout=5.0,
    )
    async def pool_daemon(
        stopped: kopf.DaemonStopped, body: kopf.Body, namespace: str | None, name: str, **_: Any
    ) -> None:
        # One coordinator per GPUPool: the only place that decides who wakes on its device.
        assert runtime.api is not None
        namespace = namespace or ""

        emit = teller(body, recorder=runtime.events(), what="pool")

        def members() -> list[ModelLoop]:
            return [loop for (ns, _), loop in runtime.loops.items() if ns == namespace]

        loop = PoolLoop(
            namespace=namespace,
            name=name,
            body=body,
            api=runtime.api,
            hub=runtime.pools,
            models=members,
            emit=emit,
            metrics=runtime.metrics,
            interval=runtime.settings.probe_interval,
            expected=lambda: runtime.indexes.models_in(namespace) if runtime.indexes else (),
        )
        runtime.pools.loops[(namespace, name)] = loop

        try:
            await until_stopped(loop.run, loop.poke, stopped, runtime, f"pool:{namespace}/{name}")
        finally:
            runtime.pools.loops.pop((namespace, name), None)
            loop.stop()
