"""Which pods a model's loop acts on: those its selector matches, less those another model
selects too; a selector that matches nothing, a model name another model holds and pods
shared with another model are each told once, and so is their end."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from snooze.api.eventreasons import RESOLVED, EventReason
from snooze.api.models import InferenceModelSpec, LabelSelector
from snooze.kube.pods import PodInfo
from snooze.operator.events.emit import Emit
from snooze.operator.memory import ModelMemory
from snooze.operator.status import model as status
from snooze.policy import claims
from snooze.policy.claims import Claim


@dataclass(frozen=True, kw_only=True)
class Neighbours:
    """What a model's loop may know of the other models (from kopf indices, no API calls)."""

    claims: Callable[[str], Iterable[Claim]]
    """Every valid model's claim on a model name, in any namespace."""
    selectors: Callable[[str, Mapping[str, str]], Iterable[tuple[str, LabelSelector]]]
    """(name, selector) of the valid models in a namespace that may select a pod with these
    labels (at least every one that does)."""


NO_NEIGHBOURS = Neighbours(claims=lambda _: (), selectors=lambda _, __: ())


@dataclass(frozen=True)
class Selection:
    """The pods a cycle works on."""

    selected: list[PodInfo]
    """Every pod the selector matches."""
    pods: list[PodInfo]
    """Those this model acts on: not shared with another model."""
    conflicts: status.Conflicts


class PodChooser:
    """One model's choice of pods, cycle after cycle, and what it told of them."""

    def __init__(
        self,
        *,
        namespace: str,
        name: str,
        pods: Callable[[LabelSelector], Iterable[PodInfo]],
        neighbours: Neighbours,
        memory: ModelMemory,
        emit: Emit,
    ) -> None:
        self.namespace = namespace
        self.name = name
        self.pods = pods
        self.neighbours = neighbours
        self.memory = memory
        self.emit = emit
        self._conflicts: dict[EventReason, str] = {}
        """The conflicts (kind -> message) last reported by Event, so each is told once."""
        self._no_pods = False
        """A NoPods Event was posted and no pod has matched since."""

    def choose(self, spec: InferenceModelSpec) -> Selection:
        """The pods the selector matches, and of those the ones the loop acts on."""
        selected = [p for p in self.pods(spec.selector) if spec.selector.matches(p.labels)]
        self._tell_no_pods(spec, selected)
        conflicts = self._conflicts_of(spec, selected)
        # A pod two models select is acted on by neither: each would undo what the other did.
        pods = [p for p in selected if p.name not in conflicts.shared]
        return Selection(selected=selected, pods=pods, conflicts=conflicts)

    def _tell_no_pods(self, spec: InferenceModelSpec, selected: list[PodInfo]) -> None:
        """A selector that matches no pod is said once (and its end), not at every probe."""
        at_zero = self.memory.scaled_from is not None or self.memory.scale_up_time is not None
        if not selected and not self._no_pods and not at_zero:
            selector = spec.selector.to_label_selector()
            self.emit(
                "Warning", EventReason.NO_PODS, status.no_pods_message(selector, self.namespace)
            )
            self._no_pods = True
        elif selected and self._no_pods:
            self.emit(
                "Normal", EventReason.PODS_FOUND, f"{len(selected)} pod(s) match the selector now"
            )
            self._no_pods = False

    def _conflicts_of(self, spec: InferenceModelSpec, pods: list[PodInfo]) -> status.Conflicts:
        """Whether another model holds this one's model name, and which pods others select too;
        each new conflict (and each one resolved) is told once by an Event."""
        model_name = spec.model_name or self.name
        held_by = claims.holder(self.neighbours.claims(model_name))
        name_taken = held_by is not None and held_by.key != (self.namespace, self.name)
        others = list(
            {
                n: (n, sel)
                for pod in pods
                for n, sel in self.neighbours.selectors(self.namespace, pod.labels)
                if n != self.name
            }.values()
        )
        found = status.Conflicts(
            model_name=model_name,
            name_taken=name_taken,
            shared=claims.shared_pods({p.name: p.labels for p in pods}, others),
        )
        for kind, message in (
            (EventReason.MODEL_NAME_TAKEN, found.name_message),
            (EventReason.PODS_SHARED, found.shared_message),
        ):
            told = self._conflicts.get(kind)
            if message and message != told:
                self.emit("Warning", kind, message)
                self._conflicts[kind] = message
            elif not message and told:
                self.emit("Normal", RESOLVED[kind], f"resolved: {told}")
                del self._conflicts[kind]
        return found
