"""Whether a GPU pool's books agree with its device: a wake that runs out of memory where the
books had room shows that some member holds more than they say. The member that should have
freed that memory is no longer trusted: it counts at its whole footprint, asleep too, until
its engine process ends (its model's wake.onFailure: Restart ends it at once)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from snooze.policy.pool.types import Member, MemberState, RoomFor, RoomKind
from snooze.policy.runs import Process


@dataclass(frozen=True, kw_only=True)
class Disagreement:
    """A wake out of memory that the books had room for, and whom it is blamed on."""

    pod: str
    """The member whose wake ran out of memory."""
    suspects: tuple[str, ...]
    """The members that should have freed the memory it counted on."""
    made_room: bool
    """The suspects' sleeps made the room for that wake (else: a guess, see `suspects_of`)."""


@dataclass
class Trust:
    """What one pool has seen its members free, and whom it no longer trusts."""

    since: float = 0.0
    """When this pool began to follow its members: a wake that failed before (read back from
    a model's status after a restart of the operator) is not judged, nothing of it is known."""
    untrusted: dict[str, Process] = field(default_factory=dict)
    """Member -> the engine process whose sleep did not give its memory back."""
    _states: dict[str, MemberState] = field(default_factory=dict)
    _confirmed: dict[str, int] = field(default_factory=dict)
    """Member -> the order in which this pool saw its latest sleep confirmed."""
    _count: int = 0
    _slept_for: dict[str, list[str]] = field(default_factory=dict)
    """Member whose wake sleeps made room for -> the members whose sleep was confirmed."""
    _room_makers: dict[str, list[str]] = field(default_factory=dict)
    """Member granted a wake -> the members whose sleeps made its room."""
    _failures: dict[str, float] = field(default_factory=dict)
    """Member -> when its latest wake out of memory failed (each one is judged once)."""

    def follow(self, members: Iterable[Member], sleeping_for: Mapping[str, RoomFor]) -> None:
        """This cycle's members, and what the sleeps under way make room for: a member seen
        draining and now asleep has confirmed its sleep."""
        states = {m.pod: m.state for m in members}
        for pod, state in states.items():
            if state is MemberState.ASLEEP and self._states.get(pod) is MemberState.DRAINING:
                self._count += 1
                self._confirmed[pod] = self._count
                room = sleeping_for.get(pod)
                if room is not None and room.kind is RoomKind.WAKE:
                    self._slept_for.setdefault(room.subject, []).append(pod)
        self._states = states
        for known in (self._confirmed, self.untrusted, self._failures, self._room_makers):
            for pod in [p for p in known if p not in states]:
                del known[pod]

    def granted(self, pod: str) -> None:
        """`pod` may wake: the sleeps confirmed for its wake made its room."""
        self._room_makers[pod] = self._slept_for.pop(pod, [])

    def judge(self, members: Iterable[Member], failures: Mapping[str, float]) -> list[Disagreement]:
        """The new wakes out of memory (`failures`: member -> when its last wake failed for
        want of device memory) and whom each is blamed on."""
        listed = list(members)
        found = []
        for pod, at in sorted(failures.items()):
            if at <= max(self._failures.get(pod, float("-inf")), self.since):
                continue
            self._failures[pod] = at
            made = [p for p in self._room_makers.pop(pod, []) if self._asleep(listed, p)]
            suspects = made or self.suspects_of(listed, pod)
            found.append(
                Disagreement(pod=pod, suspects=tuple(sorted(suspects)), made_room=bool(made))
            )
        return found

    def suspects_of(self, members: list[Member], failed: str) -> list[str]:
        """Whom a wake granted into free room is blamed on: the member asleep whose sleep this
        pool saw confirmed last (its memory was the last the books counted as freed), and
        those asleep it never saw sleep (asleep when it first saw them). A wrong guess meets
        the next wake out of memory, which blames another."""
        asleep = [
            m.pod
            for m in members
            if m.state is MemberState.ASLEEP and m.pod != failed and m.pod not in self.untrusted
        ]
        unseen = [p for p in asleep if p not in self._confirmed]
        seen = sorted((p for p in asleep if p in self._confirmed), key=self._confirmed.__getitem__)
        return unseen + seen[-1:]

    def distrust(self, pod: str, process: Process) -> None:
        self.untrusted[pod] = process

    def trusts(self, pod: str, process: Process | None) -> bool:
        """False while the engine process that did not free its memory still runs."""
        known = self.untrusted.get(pod)
        if known is None:
            return True
        if process is not None and not known.same_as(process):
            del self.untrusted[pod]  # a new process: it holds nothing of the old one's
            return True
        return False

    @staticmethod
    def _asleep(members: list[Member], pod: str) -> bool:
        return any(m.pod == pod and m.state is MemberState.ASLEEP for m in members)
