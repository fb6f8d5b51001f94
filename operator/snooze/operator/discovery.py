"""Whether the API serves Snooze's CRDs yet, from its discovery document.

Discovery (`/apis/GROUP/VERSION`) is readable by every authenticated client, so asking it
needs no RBAC rule; see runner.py for why the operator asks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from snooze.api import gpupool, models
from snooze.kube.api import KubeApi

log = logging.getLogger(__name__)


# kopf warns once at start-up that the resources it cannot find "cannot be served"; while the
# operator itself waits for its CRDs (and says so at INFO), that warning is wrong.
KOPF_OBSERVATION = logging.getLogger("kopf._core.reactor.observation")


class _WaitingForCrds(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Unresolved resources cannot be served")


KINDS = {models.PLURAL: "InferenceModels", gpupool.PLURAL: "GPUPools"}


async def missing_crds(api: KubeApi) -> frozenset[str]:
    """The plurals of Snooze's resources that the API does not serve yet."""
    return frozenset(
        [plural for plural in KINDS if not await api.serves(models.GROUP, models.VERSION, plural)]
    )


def restart_when_served(
    api: KubeApi, restart: Callable[[], None], *, missing: frozenset[str], interval: float
) -> Coroutine[Any, Any, None]:
    """Poll discovery until one of the `missing` resources is served, then `restart` kopf to
    serve it (kopf learns its resources only when it starts; the restarted one polls for the
    rest). kopf's warning about them is silenced from now (not from when the poll first runs:
    kopf may warn before that) until the poll ends."""
    names = [KINDS[plural] for plural in KINDS if plural in missing]
    log.info(
        "%s served once %s installed (kubectl apply -f crds/); checking every %gs",
        " and ".join(names) + " are",
        "their CRDs are" if len(names) > 1 else "their CRD is",
        interval,
    )
    quiet = _WaitingForCrds()
    KOPF_OBSERVATION.addFilter(quiet)

    async def poll() -> None:
        try:
            while True:
                await asyncio.sleep(interval)
                with contextlib.suppress(Exception):  # the API may be away: ask again
                    if missing - await missing_crds(api):
                        break
        finally:
            KOPF_OBSERVATION.removeFilter(quiet)
        log.info("a CRD is installed: restarting kopf's watches to serve it")
        restart()

    return poll()
