"""The GPUPool handlers: one coordinating loop per pool, poked when its spec changes."""

from __future__ import annotations

from typing import Any

import kopf

from snooze.operator.events.teller import teller
from snooze.operator.model.loop import ModelLoop
from snooze.operator.pool.loop import PoolLoop
from snooze.operator.runtime import Memo, until_stopped


async def pool_changed(namespace: str | None, name: str, memo: Memo, **_: Any) -> None:
    """Its spec is read live by its loop: a change is acted on now, not at the next interval.
    Async, as the other event handlers: kopf runs a sync one in a thread, where setting the
    loop's asyncio.Event is unsafe (the wakeup can be lost)."""
    loop = memo.started.pools.loops.get((namespace or "", name))
    if loop is not None:
        loop.poke()


async def pool_daemon(
    stopped: kopf.DaemonStopped,
    body: kopf.Body,
    namespace: str | None,
    name: str,
    memo: Memo,
    **_: Any,
) -> None:
    """One coordinator per GPUPool: the only place that decides who wakes on its device."""
    started, settings = memo.started, memo.runtime.settings
    namespace = namespace or ""

    def members() -> list[ModelLoop]:
        return [loop for (ns, _), loop in started.loops.items() if ns == namespace]

    loop = PoolLoop(
        namespace=namespace,
        name=name,
        body=body,
        api=started.api,
        hub=started.pools,
        models=members,
        emit=teller(body, recorder=started.recorder, what="pool"),
        metrics=memo.runtime.metrics,
        interval=settings.probe_interval,
        expected=lambda: started.indexes.models_in(namespace),
    )
    started.pools.loops[(namespace, name)] = loop

    try:
        await until_stopped(loop.run, loop.poke, stopped, started, f"pool:{namespace}/{name}")
    finally:
        started.pools.loops.pop((namespace, name), None)
        loop.stop()
