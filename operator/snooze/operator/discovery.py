"""Whether the API serves the InferenceModel CRD yet, from its discovery document.

Discovery (`/apis/GROUP/VERSION`) is readable by every authenticated client, so asking it
needs no RBAC rule; see runner.py for why the operator asks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from snooze import models
from snooze.kube.api import KubeApi

log = logging.getLogger(__name__)


async def crd_served(api: KubeApi) -> bool:
    return await api.serves(models.GROUP, models.VERSION, models.PLURAL)


async def restart_when_served(
    api: KubeApi, restart: Callable[[], None], *, interval: float
) -> None:
    """Poll discovery until the CRD is served, then `restart` kopf to serve it."""
    log.info(
        "InferenceModels are served once their CRD is installed (kubectl apply -f crds/); "
        "checking every %gs",
        interval,
    )
    while True:
        await asyncio.sleep(interval)
        with contextlib.suppress(Exception):  # the API may be away for a while: ask again
            if await crd_served(api):
                break
    log.info("the InferenceModel CRD is installed: restarting kopf's watches to serve it")
    restart()
