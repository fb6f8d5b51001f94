"""The gateway's watch-fed view of InferenceModels and their pods: what exists and what is awake."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from snooze.kube.pods import PodInfo, parse_time, pod_info
from snooze.models import (
    WAKE_REQUESTED_ANNOTATION,
    DesiredState,
    EngineState,
    InferenceModelSpec,
    Phase,
    SpecError,
    parse_spec,
)

Key = tuple[str, str]
MODELS = "models"
PODS = "pods"


@dataclass(frozen=True, kw_only=True)
class Model:
    """One InferenceModel as the gateway needs it."""

    namespace: str
    name: str
    model_name: str
    spec: InferenceModelSpec | None
    """None when the spec is invalid; `spec_error` then says why."""
    spec_error: str = ""
    wake_requested_at: float | None = None
    phase: str = "Pending"
    last_wake_seconds: float | None = None
    scaled_to_zero_at: float | None = None
    """When the operator scaled the model's workload to zero (status.scaledToZeroTime)."""

    @property
    def key(self) -> Key:
        return (self.namespace, self.name)

    @property
    def at_zero(self) -> bool:
        """Its workload is at zero replicas or coming back: a wake is a cold start."""
        return self.phase in (Phase.SCALED_TO_ZERO.value, Phase.SCALING_UP.value)

    def hold_seconds(self) -> float:
        """How long a request may wait for this model: a wake, or a cold start from zero."""
        assert self.spec is not None
        if self.at_zero:
            return self.spec.cold_start_timeout_seconds
        return self.spec.wake_timeout_seconds

    def hold_limit_name(self) -> str:
        assert self.spec is not None
        if self.at_zero:
            return f"wake.coldStartTimeout ({self.spec.wake.cold_start_timeout})"
        return f"wake timeout ({self.spec.wake.timeout})"

    def refusal(self) -> str | None:
        """Why a request must not wait for this model to wake, or None if it may."""
        if self.spec is None:
            return f"model {self.model_name!r} has an invalid spec: {self.spec_error}"
        if self.spec.desired_state is DesiredState.ASLEEP:
            return (
                f"model {self.model_name!r} is asleep on purpose (spec.desiredState: Asleep); "
                "set desiredState to Auto or Awake to use it"
            )
        if not self.spec.wake.on_request:
            return (
                f"model {self.model_name!r} is asleep and does not wake on request "
                "(spec.wake.onRequest: false); wake it by hand or set onRequest to true"
            )
        return None


def model_from(body: Mapping[str, Any]) -> Model:
    """Read an InferenceModel manifest; an invalid spec is kept (listed, refused), never raised."""
    meta = body.get("metadata") or {}
    status = body.get("status") or {}
    raw_spec = body.get("spec") or {}
    spec: InferenceModelSpec | None
    try:
        spec, error = parse_spec(raw_spec), ""
    except SpecError as exc:
        spec, error = None, str(exc)
    name = str(meta.get("name", ""))
    model_name = (spec.model_name if spec else raw_spec.get("modelName")) or name
    annotations = meta.get("annotations") or {}
    last_wake = status.get("lastWakeSeconds")
    return Model(
        namespace=str(meta.get("namespace", "")),
        name=name,
        model_name=str(model_name),
        spec=spec,
        spec_error=error,
        wake_requested_at=parse_time(annotations.get(WAKE_REQUESTED_ANNOTATION)),
        phase=str(status.get("phase") or ("Invalid" if spec is None else "Pending")),
        last_wake_seconds=float(last_wake) if isinstance(last_wake, int | float) else None,
        scaled_to_zero_at=parse_time(status.get("scaledToZeroTime")),
    )


def routable(pod: PodInfo) -> bool:
    """Ready (loaded, running, not deleting) and published as awake by the operator."""
    return pod.ready and pod.state is EngineState.AWAKE and pod.ip is not None


class Registry:
    """Models and pods by (namespace, name); every change wakes the coroutines that wait on it.

    It is fed only by the watchers (one loop), so it needs no locks.
    """

    def __init__(self, *, scopes: Iterable[str | None]) -> None:
        self.models: dict[Key, Model] = {}
        self.pods: dict[Key, PodInfo] = {}
        # Each (kind, namespace scope) must be listed once before the gateway is ready.
        self._unlisted = {(kind, scope) for kind in (MODELS, PODS) for scope in scopes}
        self._changed = asyncio.Event()

    @property
    def ready(self) -> bool:
        return not self._unlisted

    def replace(self, kind: str, scope: str | None, items: Iterable[Mapping[str, Any]]) -> None:
        """A fresh list of `kind` in `scope` (None: all namespaces) replaces what was known."""
        store: dict[Key, Any] = self.models if kind == MODELS else self.pods
        for key in [k for k in store if scope is None or k[0] == scope]:
            del store[key]
        for item in items:
            self._put(kind, item)
        self._unlisted.discard((kind, scope))
        self._notify()

    def apply(self, kind: str, event_type: str, obj: Mapping[str, Any]) -> None:
        """One watch event (ADDED, MODIFIED, DELETED)."""
        if event_type == "DELETED":
            meta = obj.get("metadata") or {}
            store: dict[Key, Any] = self.models if kind == MODELS else self.pods
            store.pop((str(meta.get("namespace", "")), str(meta.get("name", ""))), None)
        elif event_type in ("ADDED", "MODIFIED"):
            self._put(kind, obj)
        self._notify()

    def note_model(self, body: Mapping[str, Any]) -> None:
        """An object this gateway just wrote: known before its watch event arrives."""
        self.apply(MODELS, "MODIFIED", body)

    def _put(self, kind: str, obj: Mapping[str, Any]) -> None:
        if kind == MODELS:
            model = model_from(obj)
            self.models[model.key] = model
        else:
            pod = pod_info(obj)
            self.pods[(pod.namespace, pod.name)] = pod

    def _notify(self) -> None:
        # Swap, then set: a waiter that re-checks after this change waits for the next one.
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def wait_change(self, seconds: float) -> None:
        """Return at the next change, or after `seconds`."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), seconds)

    def find(self, model_name: str) -> Model | None:
        """The model clients call `model_name`; on a clash, the first by namespace and name."""
        found = [m for m in self.models.values() if m.model_name == model_name]
        return min(found, key=lambda m: m.key) if found else None

    def get(self, key: Key) -> Model | None:
        return self.models.get(key)

    def pods_of(self, model: Model) -> list[PodInfo]:
        if model.spec is None:
            return []
        selector = model.spec.selector
        return [
            pod
            for (namespace, _), pod in self.pods.items()
            if namespace == model.namespace and selector.matches(pod.labels)
        ]

    def awake_pods(self, model: Model) -> list[PodInfo]:
        return [pod for pod in self.pods_of(model) if routable(pod)]
