"""Run kopf with Snooze's handlers, and once more when a CRD it lacked (InferenceModel, GPUPool)
appears.

kopf learns at start-up which resources the cluster serves. To see a CRD installed later it
would list and watch every CustomResourceDefinition of the cluster (and, for a namespaced
operator, every namespace): read rights no other part of Snooze needs, and a namespaced
install has no ClusterRole to hold them. Instead, an operator that starts before its CRD
asks the API's discovery document (which every authenticated client may read) until the
CRD is served, then restarts kopf's watches in the same process to serve it.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import kopf

from snooze.operator.handlers.registry import build_registry
from snooze.operator.runtime import Memo, Runtime


async def serve(
    runtime: Runtime,
    *,
    stop: threading.Event | None = None,
    ready: threading.Event | None = None,
    **options: Any,
) -> None:
    """Run the operator until a signal stops it, or `stop` is set and `runtime.restart()`
    called (OperatorThread.stop does both); run kopf again each time the CRD it lacked at
    start-up is installed. `options` go to `kopf.operator`."""
    while stop is None or not stop.is_set():
        restart = asyncio.Event()
        runtime.restart = restart.set
        await kopf.operator(
            registry=build_registry(),
            memo=Memo(runtime),
            stop_flag=restart,
            ready_flag=ready,
            **options,
        )
        if not restart.is_set():
            return  # a signal, or a failure kopf has logged
