"""When the gateway takes an engine as stuck (gateway/bounds/stalls.py), on a real event loop with a
start timeout of a tenth of a second: a stream that waits that long on an engine that sends
nothing; not one whose engine answers others meanwhile; an answer that comes whole only once
the gateway's own one-token stream has waited as long; and how long the engine is avoided."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from snooze.gateway.bounds.stalls import AVOID_FIRST, AVOID_MOST, EngineStuck, Stalls
from snooze.gateway.metrics import GatewayMetrics

BOUND = 0.1
ENGINE = ("default", "chat-0")


def stalls() -> Stalls:
    return Stalls(bound=BOUND, metrics=GatewayMetrics())


def stalled(s: Stalls) -> float:
    return s.metrics.pod_stalls.labels(*ENGINE)._value.get()


async def wait_on(s: Stalls, *, stream: bool, seconds: float, probe: object = None) -> str:
    """A request that waits `seconds` for its answer to start: how it ended."""
    try:
        async with s.waiting(ENGINE, stream=stream, probe=probe):  # type: ignore[arg-type]
            await asyncio.sleep(seconds)
    except EngineStuck as exc:
        return f"stuck, avoided {exc.avoid:g}s"
    return "answered"


def test_a_stream_that_starts_nothing_for_the_bound_is_stuck() -> None:
    async def main() -> None:
        s = stalls()
        loop = asyncio.get_running_loop()
        began = loop.time()
        said = await wait_on(s, stream=True, seconds=10)
        assert said.startswith("stuck")
        assert BOUND <= loop.time() - began < 5 * BOUND
        assert stalled(s) == 1
        assert 0 < s.avoided(ENGINE) <= AVOID_FIRST

    asyncio.run(main())


def test_an_engine_that_answers_others_is_not_stuck() -> None:
    """A request waits five bounds in its queue while another request's stream goes on."""

    async def streaming(s: Stalls) -> None:
        async with s.waiting(ENGINE, stream=True) as watch:
            for _ in range(10):
                await asyncio.sleep(BOUND / 2)
                watch.progress()

    async def main() -> None:
        s = stalls()
        other = asyncio.create_task(streaming(s))
        await asyncio.sleep(BOUND / 4)  # it has started
        assert await wait_on(s, stream=True, seconds=4 * BOUND) == "answered"
        await other
        assert stalled(s) == 0 and s.avoided(ENGINE) == 0

    asyncio.run(main())


def test_every_request_waiting_on_a_stuck_engine_ends_with_it() -> None:
    async def main() -> None:
        s = stalls()
        ends = await asyncio.gather(
            wait_on(s, stream=True, seconds=10),
            wait_on(s, stream=False, seconds=10),
            wait_on(s, stream=True, seconds=10),
        )
        assert all(end.startswith("stuck") for end in ends), ends
        assert stalled(s) == 1

    asyncio.run(main())


def probe_that(
    answers: bool | None, after: float
) -> tuple[list[int], Callable[[], Awaitable[bool | None]]]:
    calls: list[int] = []

    async def probe() -> bool | None:
        calls.append(1)
        await asyncio.sleep(after)
        return answers

    return calls, probe


def test_an_answer_that_comes_whole_is_judged_by_a_probe() -> None:
    """Its own wait proves nothing (a long generation sends nothing): after a bound, one
    stream of the gateway's own; the engine is stuck only if that stream too starts nothing
    within a bound."""

    async def main() -> None:
        answering, probe = probe_that(True, after=BOUND / 10)
        s = stalls()
        assert await wait_on(s, stream=False, seconds=3 * BOUND, probe=probe) == "answered"
        assert answering and stalled(s) == 0

        silent, probe = probe_that(True, after=100)
        s = stalls()
        began = asyncio.get_running_loop().time()
        assert (await wait_on(s, stream=False, seconds=10, probe=probe)).startswith("stuck")
        took = asyncio.get_running_loop().time() - began
        assert silent == [1] and 2 * BOUND <= took < 6 * BOUND

    asyncio.run(main())


def test_a_probe_that_cannot_tell_leaves_the_request_alone() -> None:
    """An engine that refuses the probe (a model without completions): no verdict, and no
    second probe soon."""

    async def main() -> None:
        calls, probe = probe_that(None, after=0)
        s = stalls()
        assert await wait_on(s, stream=False, seconds=5 * BOUND, probe=probe) == "answered"
        assert calls == [1] and stalled(s) == 0

    asyncio.run(main())


def test_an_engine_found_stuck_again_is_avoided_twice_as_long_up_to_a_bound() -> None:
    async def main() -> None:
        s = stalls()
        avoided = []
        for _ in range(8):
            said = await wait_on(s, stream=True, seconds=10)
            avoided.append(float(said.split()[-1].rstrip("s")))
        assert avoided[:4] == [AVOID_FIRST, 2 * AVOID_FIRST, 4 * AVOID_FIRST, 8 * AVOID_FIRST]
        assert max(avoided) == AVOID_MOST
        s.forget(*ENGINE)  # the pod is deleted: nothing is kept of it
        assert s.avoided(ENGINE) == 0

    asyncio.run(main())


def test_a_request_cancelled_otherwise_is_not_taken_for_a_stuck_engine() -> None:
    """Its client left: the cancel goes through as it is."""

    async def main() -> None:
        s = stalls()
        task = asyncio.create_task(wait_on(s, stream=True, seconds=10))
        await asyncio.sleep(BOUND / 2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # A sleep: the bound passes twice with the client gone; nothing may count it stalled.
        await asyncio.sleep(2 * BOUND)
        assert stalled(s) == 0

    asyncio.run(main())


def test_an_engine_the_operator_relabels_is_judged_afresh() -> None:
    """Found stuck twice, then relabelled (found asleep, or woken): no longer avoided, and
    a new stall is avoided as a first one is."""

    async def main() -> None:
        s = stalls()
        for _ in range(2):
            await wait_on(s, stream=True, seconds=10)
        assert s.avoided(ENGINE) > AVOID_FIRST
        s.pardon(*ENGINE)
        assert s.avoided(ENGINE) == 0
        said = await wait_on(s, stream=True, seconds=10)
        assert float(said.split()[-1].rstrip("s")) == AVOID_FIRST

    asyncio.run(main())
