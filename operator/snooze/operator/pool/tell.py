"""What a GPU pool tells people of its members' sleeps, in Events and log lines: what a sleep
makes room for, a sleep that did not free its memory, a member asleep that nobody put to sleep."""

from __future__ import annotations

from collections.abc import Callable

from snooze.policy.pool.books import Blame
from snooze.policy.pool.types import RoomFor, RoomKind

ModelOf = Callable[[str], str | None]
"""A member's model, by its pod (None: not known)."""


def making_room(room: RoomFor, model_of: ModelOf) -> str:
    """What a sleep makes room for, for people."""
    if room.kind is RoomKind.HEADROOM:
        return "keep room free for the next wake (headroom)"
    if room.kind is RoomKind.PRIME:
        return "pin its host copy ahead of need, and wakes again at once (prime)"
    if room.kind is RoomKind.START:
        return f"make room for starting {room.subject}"
    if room.kind is RoomKind.BOOKS:
        return (
            "make the pool's books good: they count more than its device holds (a member "
            "whose sleep frees nothing counts whole)"
        )
    return f"make room for {model_of(room.subject) or 'another member'}"


def blame_message(blame: Blame, model_of: ModelOf) -> str:
    """A wake out of memory where the pool's books had room, and whom it is blamed on."""
    failed = f"{blame.failed} ({model_of(blame.failed) or '?'})"
    if blame.pod is None:
        return (
            f"{failed}: its wake ran out of memory where the pool's books had room, and no "
            "member asleep can be blamed: something outside the pool holds memory on its device"
        )
    how = (
        "its sleep made the room for that wake"
        if blame.made_room
        else "it is the likeliest to hold memory its sleep should have freed"
    )
    then = (
        "; its pod is restarted (wake.onFailure: Restart)"
        if blame.restart
        else "; restart its pod to give the memory back"
    )
    return (
        f"{blame.pod} ({model_of(blame.pod) or '?'}) said it slept, but the device did not get "
        f"its memory back: {failed} ran out of memory waking where the pool's books had room, "
        f"and {how}. The pool counts {blame.pod} at its whole footprint, asleep too, until its "
        f"engine restarts{then}"
    )


def unasked_message(pod: str, model: str | None) -> str:
    return (
        f"{pod} ({model or '?'}) says it sleeps, but Snooze never put it to sleep (its pod has "
        "no mark of a sleep of Snooze's): the pool counts it at its whole footprint until it "
        "is seen awake"
    )
