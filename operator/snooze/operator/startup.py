"""The operator's first reads of the Kubernetes API, retried with backoff until the API answers
them, one line per failed attempt naming the API's address and the wait before the next.

kopf retries a startup handler that raises every 60 seconds, logging each failure with its
whole traceback (kopf/_core/actions/execution.py, `execute_handler_once`): an operator started
against an API server that does not answer printed a twenty-line traceback every minute, and
said neither where it was trying nor when it would try again. The retries are made here
instead, so kopf's startup handler does not fail while the API is away.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

from snooze.api.durations import format_duration
from snooze.kube.api import KubeApi, KubeError
from snooze.operator.discovery import missing_crds
from snooze.operator.indexes import Indexes

log = logging.getLogger(__name__)

FIRST_WAIT = 1.0
LONGEST_WAIT = 30.0


def backoff(first: float = FIRST_WAIT, longest: float = LONGEST_WAIT) -> Iterator[float]:
    """Pure: the waits between attempts, doubling from `first` up to `longest`, for ever."""
    wait = first
    while True:
        yield wait
        wait = min(wait * 2, longest)


def failure(server: str, error: KubeError) -> str:
    """Pure: what one failed attempt says, without the wait."""
    if error.status is None:
        return f"the Kubernetes API at {server} does not answer ({error})"
    return f"the Kubernetes API at {server} refused a start-up read ({error})"


async def first_reads(api: KubeApi, namespaces: tuple[str, ...]) -> tuple[Indexes, frozenset[str]]:
    """The pods and models the operator starts from, and the CRDs not served yet; tried until
    the API answers them all, however long that takes (a SIGTERM cancels the wait)."""
    pauses = backoff()
    attempt = 1
    while True:
        try:
            await answers(api)
            indexes = Indexes()
            await indexes.load(api, namespaces)
            missing = await missing_crds(api)
        except KubeError as exc:
            wait = next(pauses)
            log.warning("%s; trying again in %s", failure(api.server, exc), format_duration(wait))
            await asyncio.sleep(wait)
            attempt += 1
            continue
        if attempt > 1:
            log.info("the Kubernetes API at %s answers (attempt %d)", api.server, attempt)
        return indexes, missing


async def answers(api: KubeApi) -> None:
    """One quick request, not retried: while the API does not answer at all, each attempt
    fails at once, not after the retries every other request makes. Any HTTP answer will do
    (an API server may keep /version from some clients)."""
    try:
        await api.request("GET", "/version", retry=False)
    except KubeError as exc:
        if exc.status is None:
            raise
