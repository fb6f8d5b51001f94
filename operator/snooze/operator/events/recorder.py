"""The operator's Events on the API: correlated (correlation.py), queued, and written one
at a time after every other write, so that telling never holds up a step."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Mapping
from typing import Any

from snooze.api.times import format_time
from snooze.kube.api import KubeApi, KubeError, NotFound, Ref
from snooze.operator.events.correlation import Correlator, Regarding, Told, Write

log = logging.getLogger(__name__)

COMPONENT = "snooze-operator"
QUEUED = 1000
"""Events waiting to be written at most: beyond, the newest are dropped (client-go's
broadcaster drops too), and the log line each Event has already says it."""
MAX_MESSAGE = 1024
"""The longest message written (the API refuses longer ones): cut in the middle."""


def regarding(body: Mapping[str, Any]) -> Regarding:
    """The object a kopf body is, as an Event's involvedObject."""
    meta: Mapping[str, Any] = body.get("metadata") or {}
    return Regarding(
        namespace=str(meta.get("namespace") or ""),
        kind=str(body.get("kind") or ""),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        api_version=str(body.get("apiVersion") or ""),
    )


def _cut(message: str) -> str:
    if len(message) <= MAX_MESSAGE:
        return message
    half = (MAX_MESSAGE - 3) // 2
    return f"{message[:half]}...{message[-half:]}"


def event_body(write: Write, *, instance: str) -> dict[str, Any]:
    """A core/v1 Event as client-go's recorder writes it (pure)."""
    told, about = write.told, write.told.regarding
    involved = {
        "apiVersion": about.api_version,
        "kind": about.kind,
        "name": about.name,
        "namespace": about.namespace,
        "uid": about.uid,
    }
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": write.name, "namespace": about.namespace},
        "involvedObject": {k: v for k, v in involved.items() if v},
        "type": told.type,
        "reason": told.reason,
        "message": _cut(told.message),
        "count": write.count,
        "firstTimestamp": format_time(write.first),
        "lastTimestamp": format_time(write.last),
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": instance,
    }


class EventRecorder:
    """Writes the operator's Events: one task, in the order they were told."""

    def __init__(self, api: KubeApi, *, instance: str | None = None) -> None:
        self.api = api
        self.instance = instance or socket.gethostname()
        self.correlator = Correlator()
        self._queue: asyncio.Queue[Write] = asyncio.Queue(maxsize=QUEUED)
        self._task: asyncio.Task[None] | None = None
        self.dropped = 0
        """Events not written because the queue was full."""

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="events")

    async def stop(self) -> None:
        """Write what is queued (a few seconds at most), then stop."""
        if self._task is None:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(5.0):
                await self._queue.join()
        self._task.cancel()
        await asyncio.wait((self._task,))
        self._task = None

    def tell(self, about: Regarding, kind: str, reason: str, message: str) -> None:
        """Queue an Event (correlated: maybe a patch of an earlier one, maybe held back)."""
        told = Told(regarding=about, type=kind, reason=reason, message=message)
        write = self.correlator.correlate(told, time.time())
        if write is None:
            return
        try:
            self._queue.put_nowait(write)
        except asyncio.QueueFull:
            self.dropped += 1

    async def _run(self) -> None:
        while True:
            write = await self._queue.get()
            try:
                await self._write(write)
            except Exception as exc:  # an Event lost is said in the log; the next ones go on
                log.warning("could not write the %s Event: %s", write.told.reason, exc)
            finally:
                self._queue.task_done()

    async def _write(self, write: Write) -> None:
        namespace = write.told.regarding.namespace
        ref = Ref(f"/api/v1/namespaces/{namespace}/events")
        body = event_body(write, instance=self.instance)
        if write.patch:
            change = {k: body[k] for k in ("count", "lastTimestamp", "message")}
            with contextlib.suppress(NotFound):  # gone (expired): written anew below
                await self.api.patch(ref, write.name, change)
                return
        try:
            await self.api.request("POST", ref.path, body=body)
        except KubeError as exc:
            if exc.status != 409:  # 409: already there (an earlier try got through)
                raise
