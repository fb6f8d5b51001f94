"""Turns on a bounded number of slots: the urgent first, owners in rotation, and no turn lost to
a waiter cancelled on its way in."""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Hashable


class Turn:
    """One holder's turn: given back once, whether by the holder when it is done or earlier (a
    lease that ran out)."""

    def __init__(self, turns: Turns) -> None:
        self._turns: Turns | None = turns

    def give_back(self) -> None:
        if self._turns is not None:
            turns, self._turns = self._turns, None
            turns.give_back()


class Turns:
    """At most `limit` holders at once; waiters marked urgent take their turn before the others;
    within each kind, waiters of different owners take turns in rotation, and each owner's
    waiters come first come, first served.

    Urgent requests are those a decision is blocked on: the first probe of an engine that has
    never answered, which stays unlabelled (so the gateway sends it nothing) until it does, and
    the probe that confirms a wake. At start-up, the first probes of ten thousand engines
    otherwise wait behind the routine probes of the engines already labelled, which come round
    every interval.

    Owners are models: one with two hundred engines to probe and one with a single engine each
    get every other free turn, so a model whose engines are slow (or many) delays the others
    by one turn, not by the whole of its queue.
    """

    def __init__(self, limit: int) -> None:
        self._free = limit
        self._urgent: OrderedDict[Hashable, deque[asyncio.Future[None]]] = OrderedDict()
        self._routine: OrderedDict[Hashable, deque[asyncio.Future[None]]] = OrderedDict()

    @contextlib.asynccontextmanager
    async def turn(self, *, urgent: bool = False, owner: Hashable = None) -> AsyncIterator[Turn]:
        await self._take(urgent, owner)
        held = Turn(self)
        try:
            yield held
        finally:
            held.give_back()

    async def _take(self, urgent: bool, owner: Hashable) -> None:
        if self._free > 0 and not self._urgent and not self._routine:
            self._free -= 1
            return
        queues = self._urgent if urgent else self._routine
        turn = asyncio.get_running_loop().create_future()
        queues.setdefault(owner, deque()).append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            # A waiter cancelled before its turn stays queued, skipped by give_back (which
            # empties the queues of such waiters before a turn goes free): O(1) either way.
            if not turn.cancelled():
                self.give_back()  # given its turn, then cancelled: the next waiter has it
            raise

    def give_back(self) -> None:
        for queues in (self._urgent, self._routine):
            while queues:
                owner, waiting = next(iter(queues.items()))
                turn = waiting.popleft()
                if waiting:
                    queues.move_to_end(owner)  # its next waiter comes after the other owners'
                else:
                    del queues[owner]
                if not turn.done():
                    turn.set_result(None)
                    return
        self._free += 1
