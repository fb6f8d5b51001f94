"""What the operator and the gateway need to know of a pod, read from its manifest."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from snooze.models import STATE_LABEL, EngineState

SLEEP_STARTED_ANNOTATION = "snooze.dev/sleep-started-at"


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
    )
