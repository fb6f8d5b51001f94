"""Every (verb, resource) that Snooze's processes use: the chart's RBAC must match it."""

from __future__ import annotations

from dataclasses import dataclass

from snooze import models


@dataclass(frozen=True, kw_only=True)
class Permission:
    """One RBAC rule: what it grants and why the code needs it."""

    group: str
    resource: str
    verbs: tuple[str, ...]
    why: str


OPERATOR: tuple[Permission, ...] = (
    Permission(
        group=models.GROUP,
        resource=models.PLURAL,
        verbs=("get", "list", "watch", "patch"),
        why="watch InferenceModels; kopf patches its finalizer and progress annotations",
    ),
    Permission(
        group=models.GROUP,
        resource=f"{models.PLURAL}/status",
        verbs=("get", "patch"),
        why="report phase, engines, wakes and conditions on the status subresource",
    ),
    Permission(
        group="",
        resource="pods",
        verbs=("get", "list", "watch", "patch", "delete"),
        why="find each model's pods, publish their snooze.dev/state label, and delete a pod "
        "whose engine cannot wake (wake.onFailure: Restart)",
    ),
    Permission(
        group="",
        resource="events",
        verbs=("create",),
        why="post an Event for each sleep, wake and failure",
    ),
)
