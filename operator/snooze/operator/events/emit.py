"""What telling an Event takes: the Emit protocol that every part of the operator tells
through, for one model or one GPU pool (teller.py makes one for each)."""

from __future__ import annotations

from typing import Literal, Protocol

from snooze.api.eventreasons import EventReason

EventType = Literal["Normal", "Warning"]
"""Kubernetes' two Event types (core/v1 Event.type)."""


class Emit(Protocol):
    """Tell an Event on the object it was made for (and the same as one log line): its type,
    its reason (an EventReason, so that each is spelled once), and a message that names the
    pod if the Event is about one."""

    def __call__(self, kind: EventType, reason: EventReason, message: str, /) -> None: ...
