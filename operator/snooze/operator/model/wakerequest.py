"""A model's wake request as its loop reads it from the annotation, and clears it once a wake
answered it (policy/sleep.py answered_request), so that it never stands again."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from snooze.api.agreed import WAKE_REQUESTED_ANNOTATION
from snooze.api.times import parse_time
from snooze.kube.api import KubeApi, KubeError, models_ref

log = logging.getLogger(__name__)

JSON_PATCH = "application/json-patch+json"
# RFC 6901: the annotation's `/` is written `~1` in a JSON pointer.
POINTER = "/metadata/annotations/" + WAKE_REQUESTED_ANNOTATION.replace("~", "~0").replace("/", "~1")


def annotation(body: Mapping[str, Any]) -> str | None:
    """The wake request's annotation as written on the model (None: none)."""
    annotations = (body.get("metadata") or {}).get("annotations") or {}
    text = annotations.get(WAKE_REQUESTED_ANNOTATION)
    return text if isinstance(text, str) else None


def requested_at(body: Mapping[str, Any]) -> float | None:
    """When the wake request was made, from the model's annotation (None: none, or unreadable)."""
    return parse_time(annotation(body))


class Clearer:
    """Removes one model's answered wake request, each one at most once."""

    def __init__(self, *, api: KubeApi, namespace: str, name: str) -> None:
        self.api, self.namespace, self.name = api, namespace, name
        self._tried: str | None = None

    async def clear(self, stamp: str) -> None:
        """Remove the annotation if it still reads `stamp`: a gateway that wrote a newer one
        meanwhile keeps it (the patch's test fails, and the newer request stands)."""
        if stamp == self._tried:
            return  # the watch has not shown the removal yet, or it failed: not again
        self._tried = stamp
        patch = [
            {"op": "test", "path": POINTER, "value": stamp},
            {"op": "remove", "path": POINTER},
        ]
        try:
            await self.api.request(
                "PATCH",
                models_ref(self.namespace).item(self.name),
                body=patch,
                content_type=JSON_PATCH,
            )
        except KubeError as exc:
            log.info("%s/%s: answered wake request left: %s", self.namespace, self.name, exc)
            return
        log.info(
            "%s/%s: cleared the wake request of %s, answered by a wake since",
            self.namespace,
            self.name,
            stamp,
        )
