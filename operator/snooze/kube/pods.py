"""What the operator and the gateway need to know of a pod, read from its manifest."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from snooze.models import STATE_LABEL, EngineState

# Progress marks on the pod, so that an operator restarted in the middle of a step resumes
# it rather than repeats or orphans it.
SLEEP_STARTED_ANNOTATION = "snooze.dev/sleep-started-at"
"""When the drain before a sleep began (the pod was labelled draining)."""
SLEEP_SENT_ANNOTATION = "snooze.dev/sleep-sent-at"
"""When /sleep was sent for that drain: from then on the engine may be freeing its memory."""
WAKE_PROGRESS_ANNOTATION = "snooze.dev/wake-progress"
"""The steps of the wake under way that the engine has done (`weights,reload_weights`)."""


@dataclass(frozen=True, kw_only=True)
class PodInfo:
    """A pod as far as engines are concerned."""

    namespace: str
    name: str
    uid: str
    labels: Mapping[str, str] = field(default_factory=dict)
    ip: str | None = None
    ready: bool = False
    """Ready condition True, phase Running and not being deleted: the engine has loaded."""
    sleep_started: float | None = None
    """When the operator last began to put its engine to sleep (the drain)."""
    sleep_sent: float | None = None
    """When the operator sent /sleep for that drain; None, or older than it, if not yet."""
    wake_steps: frozenset[str] = frozenset()
    """Steps of the wake under way that the engine has done, to resume it without redoing them."""

    @property
    def state(self) -> EngineState | None:
        try:
            return EngineState(self.labels.get(STATE_LABEL, ""))
        except ValueError:
            return None


def parse_time(text: str | None) -> float | None:
    """An RFC 3339 time as seconds since the epoch; None if absent or unreadable."""
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def format_time(seconds: float) -> str:
    """Seconds since the epoch as the RFC 3339 form Kubernetes writes (UTC, `Z`)."""
    moment = datetime.fromtimestamp(seconds, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def pod_info(body: Mapping[str, Any]) -> PodInfo:
    """Read a pod manifest (a dict, or kopf's body) into a PodInfo."""
    meta = body.get("metadata", {})
    status = body.get("status", {}) or {}
    conditions = status.get("conditions") or []
    ready_condition = any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in conditions
    )
    ready = (
        ready_condition
        and status.get("phase") == "Running"
        and not meta.get("deletionTimestamp")
        and bool(status.get("podIP"))
    )
    annotations = meta.get("annotations") or {}
    return PodInfo(
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        labels=dict(meta.get("labels") or {}),
        ip=status.get("podIP") or None,
        ready=ready,
        sleep_started=parse_time(annotations.get(SLEEP_STARTED_ANNOTATION)),
        sleep_sent=parse_time(annotations.get(SLEEP_SENT_ANNOTATION)),
        wake_steps=frozenset(
            step for step in str(annotations.get(WAKE_PROGRESS_ANNOTATION) or "").split(",") if step
        ),
    )
