"""An engine's first record, taken while it drains before its first sleep: wakes come first.

Its greedy answers take a second or so; its weights' digests take about a second per GiB on
one rank (minutes for a large model), and vLLM finishes a digest it began whatever becomes of
the request (a utility call in its busy loop). A wake asked meanwhile (a request held at the
gateway, or any other) stops the wait at once, so that the engine is published awake again:
a cut greedy answer is taken again at the next sleep, and digests under way are kept when
they come (the engine serves the held requests once vLLM is done with them). A record that
takes longer than its bound is cut, so that the sleep goes on, and the status says so.
"""

from __future__ import annotations

import asyncio
import enum
import logging

from snooze.operator.memory import EngineMemory, Integrity
from snooze.operator.model.verification import Verifier
from snooze.policy.integrity import Check
from snooze.policy.runs import Process

log = logging.getLogger(__name__)


class Outcome(enum.Enum):
    DONE = "done"
    WANTED = "wanted"
    """A wake was asked for: the engine's drain is cancelled."""
    LATE = "late"


async def _until(task: asyncio.Task[None], wanted: asyncio.Event, seconds: float) -> Outcome:
    """Wait for `task`, up to `seconds` and no longer than `wanted` is unset."""
    waiting = asyncio.create_task(wanted.wait())
    try:
        await asyncio.wait(
            (task, waiting), timeout=max(seconds, 0.0), return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        waiting.cancel()
    if task.done():
        task.result()  # its own errors are said on the status; anything else is a bug
        return Outcome.DONE
    return Outcome.WANTED if wanted.is_set() else Outcome.LATE


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    # Not `await task`: that would raise its cancellation here, and suppressing it would
    # swallow this task's own (the model's loop stopping).
    await asyncio.wait((task,))


async def record_unless_woken(
    verifier: Verifier,
    url: str,
    model_name: str,
    engine: EngineMemory,
    process: Process,
    *,
    weights: bool,
    timeout: float,  # noqa: ASYNC109
    where: str,
) -> None:
    """Take what the engine's record lacks (verifier.record), unless a wake comes first or it
    takes longer than `timeout` seconds (see the module's docstring)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    digests = engine.recording
    if digests is None or digests.done():
        answers = asyncio.create_task(
            verifier.record(url, model_name, engine, process, weights=False)
        )
        try:
            outcome = await _until(answers, engine.cancel, deadline - loop.time())
        finally:
            if not answers.done():
                await _cancel(answers)
        if outcome is Outcome.WANTED:
            log.info("%s: a wake cut its record short; it is taken at its next sleep", where)
            return
        if outcome is Outcome.LATE:
            _cut(verifier.current(engine, process), timeout, weights=weights, where=where)
            return
        if not weights:
            return
        digests = engine.recording = asyncio.create_task(
            verifier.record(url, model_name, engine, process, output=False)
        )
    outcome = await _until(digests, engine.cancel, deadline - loop.time())
    if outcome is Outcome.WANTED:
        log.info("%s: a wake is asked for: its digests are kept when vLLM gives them", where)
    elif outcome is Outcome.LATE:
        await _cancel(digests)
        _cut(verifier.current(engine, process), timeout, weights=True, where=where)


def _cut(integrity: Integrity, timeout: float, *, weights: bool, where: str) -> None:
    if integrity.output is Check.PENDING:
        integrity.output = Check.UNAVAILABLE
    if weights and integrity.weights is Check.PENDING:
        integrity.weights = Check.UNAVAILABLE
    integrity.message = (
        f"its record before its first sleep took longer than {timeout:g}s, and was cut so "
        "that the sleep goes on: it is taken again at its next sleep"
    )
    log.warning("%s: %s", where, integrity.message)
