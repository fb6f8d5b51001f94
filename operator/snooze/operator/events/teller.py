"""Tell what the operator did: a Kubernetes Event on the model (recorder.py correlates and
writes them), and the same as one log line."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import kopf

from snooze.operator.events.emit import Emit, EventType
from snooze.operator.events.recorder import EventRecorder, regarding

# One logger for every action, so that `--log-level` and log routing can single them out.
log = logging.getLogger("snooze.operator.events")


def teller(body: kopf.Body, *, recorder: EventRecorder, what: str = "model") -> Emit:
    """An Emit for one model (or, with what="pool", one GPUPool): each call tells an Event to
    `recorder` and logs one line naming it.

    The line reads `NAMESPACE/NAME REASON: MESSAGE` (`pool NAMESPACE/NAME ...` for a pool),
    where the message names the pod; in JSON the model (or pool), namespace and reason are
    fields of their own. Warnings log as warnings.
    """
    meta: Mapping[str, Any] = body.get("metadata") or {}
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    where = f"{namespace}/{name}" if namespace else name
    if what != "model":
        where = f"{what} {where}"

    about = regarding(body)

    def emit(kind: EventType, reason: str, message: str) -> None:
        recorder.tell(about, kind, reason, message)
        level = logging.WARNING if kind == "Warning" else logging.INFO
        extra = {what: name, "namespace": namespace, "reason": reason}
        log.log(level, "%s %s: %s", where, reason, message, extra=extra)

    return emit
