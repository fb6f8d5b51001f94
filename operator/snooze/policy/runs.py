"""One run of an engine: its pod and the restarts of its container, which a pinned host copy,
a wake's integrity records and a pool's distrust each belong to (a new run holds none of them)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Process:
    """One run of an engine: its pod, and the restart count of the container it runs in."""

    pod_uid: str
    restarts: int | None
    """None: the pod does not say which container is the engine's (PodInfo.engine_restarts)."""

    def same_as(self, other: Process) -> bool:
        """Possibly the same run: the same pod, and no restart between them that both counts
        show (an unknown count proves nothing, so it is taken as the same run)."""
        return self.pod_uid == other.pod_uid and (
            self.restarts is None or other.restarts is None or self.restarts == other.restarts
        )
