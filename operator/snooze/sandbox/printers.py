"""The API server's Table columns and cells for built-in kinds (pkg/printers/internalversion)."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

Obj = dict[str, Any]
Column = tuple[str, str, int]  # name, type, priority (format "name" for the column called Name)


def parse_time(timestamp: Any) -> datetime.datetime | None:
    """An RFC 3339 timestamp (seconds or micro), or None if absent or not one; pure."""
    if not isinstance(timestamp, str) or not timestamp:
        return None
    try:
        parsed = datetime.datetime.fromisoformat(timestamp)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=datetime.UTC)


def human_duration(seconds: float) -> str:
    """apimachinery's duration.HumanDuration: ~2-3 significant figures, as AGE columns show."""
    secs = int(seconds)
    if secs < -1:
        return "<invalid>"
    if secs < 0:
        return "0s"
    if secs < 120:
        return f"{secs}s"
    minutes = secs // 60
    if minutes < 10:
        return f"{minutes}m{secs % 60}s" if secs % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    days = hours // 24
    if hours < 24 * 8:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    if hours < 24 * 365 * 2:
        return f"{days}d"
    if hours < 24 * 365 * 8:
        return f"{days // 365}y{days % 365}d" if days % 365 else f"{days // 365}y"
    return f"{days // 365}y"


def since(timestamp: Any) -> str:
    """translateTimestampSince: the age of a timestamp, `<unknown>` when it is absent."""
    when = parse_time(timestamp)
    if when is None:
        return "<unknown>"
    return human_duration((datetime.datetime.now(datetime.UTC) - when).total_seconds())


def _name(obj: Obj) -> str:
    name: str = obj["metadata"].get("name", "")
    return name


def _age(obj: Obj) -> str:
    return since(obj["metadata"].get("creationTimestamp"))


# -- Pods ----------------------------------------------------------------------------------------

POD_COLUMNS: tuple[Column, ...] = (
    ("Name", "string", 0),
    ("Ready", "string", 0),
    ("Status", "string", 0),
    ("Restarts", "string", 0),
    ("Age", "string", 0),
    ("IP", "string", 1),
    ("Node", "string", 1),
    ("Nominated Node", "string", 1),
    ("Readiness Gates", "string", 1),
)


def _restartable(container: Obj | None) -> bool:
    return container is not None and container.get("restartPolicy") == "Always"


def _terminated_reason(terminated: Obj, prefix: str) -> str:
    if terminated.get("reason"):
        return f"{prefix}{terminated['reason']}"
    if terminated.get("signal"):
        return f"{prefix}Signal:{terminated['signal']}"
    return f"{prefix}ExitCode:{terminated.get('exitCode', 0)}"


def pod_cells(pod: Obj) -> list[Any]:
    """printPod: READY, STATUS (the reason kubectl users know), RESTARTS, AGE and the wide ones."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    inits = {c.get("name"): c for c in spec.get("initContainers") or []}
    total = len(spec.get("containers") or []) + sum(_restartable(c) for c in inits.values())
    ready = restarts = sidecar_restarts = 0
    last_restart: datetime.datetime | None = None
    sidecar_last: datetime.datetime | None = None
    reason = status.get("reason") or status.get("phase") or ""
    conditions = status.get("conditions") or []
    for condition in conditions:
        if condition.get("type") == "PodScheduled" and condition.get("reason") == "SchedulingGated":
            reason = "SchedulingGated"

    def later(current: datetime.datetime | None, cs: Obj) -> datetime.datetime | None:
        finished = parse_time(
            ((cs.get("lastState") or {}).get("terminated") or {}).get("finishedAt")
        )
        return finished if finished and (current is None or finished > current) else current

    initializing = False
    init_statuses = status.get("initContainerStatuses") or []
    for i, cs in enumerate(init_statuses):
        state = cs.get("state") or {}
        restarts += int(cs.get("restartCount") or 0)
        last_restart = later(last_restart, cs)
        sidecar = _restartable(inits.get(cs.get("name")))
        if sidecar:
            sidecar_restarts += int(cs.get("restartCount") or 0)
            sidecar_last = later(sidecar_last, cs)
        terminated, waiting = state.get("terminated"), state.get("waiting")
        if terminated is not None and terminated.get("exitCode", 0) == 0:
            continue
        if sidecar and cs.get("started"):
            ready += bool(cs.get("ready"))
            continue
        if terminated is not None:
            reason = _terminated_reason(terminated, "Init:")
        elif waiting and waiting.get("reason") and waiting["reason"] != "PodInitializing":
            reason = f"Init:{waiting['reason']}"
        else:
            reason = f"Init:{i}/{len(inits)}"
        initializing = True
        break
    initialized = any(
        c.get("type") == "Initialized" and c.get("status") == "True" for c in conditions
    )
    if not initializing or initialized:
        restarts, last_restart = sidecar_restarts, sidecar_last
        running = False
        for cs in reversed(status.get("containerStatuses") or []):
            state = cs.get("state") or {}
            restarts += int(cs.get("restartCount") or 0)
            last_restart = later(last_restart, cs)
            waiting, terminated = state.get("waiting") or {}, state.get("terminated")
            if waiting.get("reason"):
                reason = waiting["reason"]
            elif terminated is not None:
                reason = _terminated_reason(terminated, "")
            elif cs.get("ready") and state.get("running") is not None:
                running = True
                ready += 1
        if reason == "Completed" and running:
            pod_ready = any(
                c.get("type") == "Ready" and c.get("status") == "True" for c in conditions
            )
            reason = "Running" if pod_ready else "NotReady"
    if pod["metadata"].get("deletionTimestamp"):
        if status.get("reason") == "NodeLost":
            reason = "Unknown"
        elif status.get("phase") not in ("Succeeded", "Failed"):
            reason = "Terminating"
    shown = str(restarts)
    if restarts and last_restart is not None:
        shown = f"{restarts} ({since(last_restart.isoformat())} ago)"
    ips = status.get("podIPs") or []
    gates = spec.get("readinessGates") or []
    gates_shown = "<none>"
    if gates:
        by_type = {c.get("type"): c.get("status") for c in conditions}
        met = sum(by_type.get(g.get("conditionType")) == "True" for g in gates)
        gates_shown = f"{met}/{len(gates)}"
    return [
        _name(pod),
        f"{ready}/{total}",
        reason,
        shown,
        _age(pod),
        (ips[0].get("ip") if ips else "") or status.get("podIP") or "<none>",
        spec.get("nodeName") or "<none>",
        status.get("nominatedNodeName") or "<none>",
        gates_shown,
    ]


# -- Events --------------------------------------------------------------------------------------

EVENT_COLUMNS: tuple[Column, ...] = (
    ("Last Seen", "string", 0),
    ("Type", "string", 0),
    ("Reason", "string", 0),
    ("Object", "string", 0),
    ("Subobject", "string", 1),
    ("Source", "string", 1),
    ("Message", "string", 0),
    ("First Seen", "string", 1),
    ("Count", "string", 1),
    ("Name", "string", 1),
)


def event_cells(event: Obj) -> list[Any]:
    """printEvent (core/v1 Event), with the wide columns, which the API server always renders."""
    first = event.get("firstTimestamp") or event.get("eventTime")
    last = event.get("lastTimestamp") or first
    count = event.get("count") or 1
    if event.get("series"):
        last, count = event["series"].get("lastObservedTime"), event["series"].get("count", 0)
    involved = event.get("involvedObject") or {}
    kind = str(involved.get("kind") or "").lower()
    target = f"{kind}/{involved['name']}" if involved.get("name") else kind
    source = event.get("source") or {}
    component = source.get("component") or event.get("reportingController") or ""
    instance = source.get("host") or event.get("reportingInstance") or ""
    return [
        since(last),
        event.get("type", ""),
        event.get("reason", ""),
        target,
        involved.get("fieldPath", ""),
        f"{component}, {instance}" if instance else component,
        str(event.get("message") or "").strip(),
        since(first),
        int(count),
        _name(event),
    ]


# -- Namespaces and Deployments ------------------------------------------------------------------

NAMESPACE_COLUMNS: tuple[Column, ...] = (
    ("Name", "string", 0),
    ("Status", "string", 0),
    ("Age", "string", 0),
)


def namespace_cells(ns: Obj) -> list[Any]:
    return [_name(ns), (ns.get("status") or {}).get("phase", ""), _age(ns)]


DEPLOYMENT_COLUMNS: tuple[Column, ...] = (
    ("Name", "string", 0),
    ("Ready", "string", 0),
    ("Up-to-date", "integer", 0),
    ("Available", "integer", 0),
    ("Age", "string", 0),
    ("Containers", "string", 1),
    ("Images", "string", 1),
    ("Selector", "string", 1),
)


def deployment_cells(deployment: Obj) -> list[Any]:
    """printDeployment: READY as ready/desired, UP-TO-DATE, AVAILABLE, AGE and the wide ones."""
    spec, status = deployment.get("spec") or {}, deployment.get("status") or {}
    containers = ((spec.get("template") or {}).get("spec") or {}).get("containers") or []
    labels = (spec.get("selector") or {}).get("matchLabels") or {}
    return [
        _name(deployment),
        f"{status.get('readyReplicas', 0)}/{spec.get('replicas', 1)}",
        status.get("updatedReplicas", 0),
        status.get("availableReplicas", 0),
        _age(deployment),
        ",".join(c.get("name", "") for c in containers),
        ",".join(c.get("image", "") for c in containers),
        ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "<none>",
    ]


# (group, plural) -> the columns and the cells of each row, for the kinds printed like the server.
BUILTIN: dict[tuple[str, str], tuple[tuple[Column, ...], Callable[[Obj], list[Any]]]] = {
    ("", "pods"): (POD_COLUMNS, pod_cells),
    ("", "events"): (EVENT_COLUMNS, event_cells),
    ("", "namespaces"): (NAMESPACE_COLUMNS, namespace_cells),
    ("apps", "deployments"): (DEPLOYMENT_COLUMNS, deployment_cells),
}
