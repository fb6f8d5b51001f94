"""Hand a deleted model's pods back as they were before Snooze: awake, unlabelled, scaled up."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

from snooze.api.agreed import (
    SLEEP_SENT_ANNOTATION,
    SLEEP_STARTED_ANNOTATION,
    STATE_LABEL,
    WAKE_PROGRESS_ANNOTATION,
)
from snooze.api.eventreasons import EventReason
from snooze.api.models import SpecError, parse_spec
from snooze.api.modelstatus import InferenceModelStatus
from snooze.engine.client import EngineClient, EngineHttp
from snooze.engine.errors import EngineError
from snooze.kube.api import (
    MERGE_PATCH,
    STRATEGIC_MERGE_PATCH,
    KubeApi,
    KubeError,
    NotFound,
    pods_ref,
)
from snooze.kube.pods import PodInfo
from snooze.operator.events.emit import Emit
from snooze.operator.model.actions import engine_url
from snooze.operator.model.readiness import gate_patch
from snooze.operator.model.scaling import scale_path
from snooze.policy.readiness import RELEASED

log = logging.getLogger(__name__)


async def release(
    *,
    api: KubeApi,
    http: EngineHttp,
    namespace: str,
    raw_spec: dict[str, Any],
    status: InferenceModelStatus,
    pods: Sequence[PodInfo],
    emit: Emit,
) -> None:
    """Wake every sleeping engine, drop Snooze's marks from the pods, restore the replicas.

    Best effort: an engine that cannot be woken is reported, never a reason to keep the
    model from being deleted.
    """
    try:
        spec = parse_spec(raw_spec)
    except SpecError:
        return  # an invalid spec never acted on anything
    mine = [p for p in pods if spec.selector.matches(p.labels)]
    woken = 0
    for pod in mine:
        awake = False
        if pod.ready and pod.ip:
            client = EngineClient(engine_url(spec, pod), client=http)
            try:
                if await client.is_sleeping():
                    await client.wake(
                        pod.sleep_level or spec.sleep.level, timeout=spec.wake_timeout_seconds
                    )
                    woken += 1
                awake = True
            except EngineError as exc:
                emit("Warning", EventReason.RELEASE_FAILED, f"{pod.name}: could not wake it: {exc}")
        if awake and pod.gated and pod.gate != RELEASED.shown:
            # Nobody writes its readiness gate from now on: an awake engine is let into its
            # Services for good (one that could not be woken stays out, as it would hang).
            with contextlib.suppress(KubeError):
                await api.request(
                    "PATCH",
                    pods_ref(namespace).item(pod.name, "status"),
                    body=gate_patch(RELEASED, pod.gate, time.time()),
                    content_type=STRATEGIC_MERGE_PATCH,
                )
        if STATE_LABEL in pod.labels or pod.sleep_started is not None or pod.wake_steps:
            patch = {
                "metadata": {
                    "labels": {STATE_LABEL: None},
                    "annotations": {
                        SLEEP_STARTED_ANNOTATION: None,
                        SLEEP_SENT_ANNOTATION: None,
                        WAKE_PROGRESS_ANNOTATION: None,
                    },
                }
            }
            with contextlib.suppress(NotFound):  # the pod went meanwhile: nothing to undo
                await api.patch(pods_ref(namespace), pod.name, patch)
    scaled_from = status.scaled_from_replicas
    if spec.scale_target_ref is not None and scaled_from is not None:
        body = {"spec": {"replicas": scaled_from}}
        try:
            await api.request(
                "PATCH",
                scale_path(namespace, spec.scale_target_ref),
                body=body,
                content_type=MERGE_PATCH,
            )
        except KubeError as exc:
            emit(
                "Warning",
                EventReason.RELEASE_FAILED,
                f"could not restore {scaled_from} replicas: {exc}",
            )
    emit(
        "Normal",
        EventReason.RELEASED,
        f"the model is deleted: {len(mine)} pod(s) handed back as they were before Snooze "
        f"({woken} woken)",
    )
