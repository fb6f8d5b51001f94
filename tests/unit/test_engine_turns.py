"""Turns on engine requests: a bounded number at once, urgent ones first, none lost to a
cancelled waiter; seen from a loopback engine that records the order requests reach it."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from snooze.engine.http import EngineHttp
from snooze.engine.probe import Prober
from snooze.engine.turns import Turns
from snooze.operator.memory import EngineMemory
from snooze.operator.model.observe import first_try


async def test_urgent_waiters_go_first_and_each_kind_keeps_its_order() -> None:
    turns = Turns(1)
    order: list[str] = []
    release = asyncio.Event()

    async def take(name: str, *, urgent: bool = False) -> None:
        async with turns.turn(urgent=urgent):
            order.append(name)
            if name == "holder":
                await release.wait()

    holder = asyncio.create_task(take("holder"))
    await asyncio.sleep(0)
    waiters = [
        asyncio.create_task(take("routine-1")),
        asyncio.create_task(take("routine-2")),
        asyncio.create_task(take("urgent-1", urgent=True)),
        asyncio.create_task(take("urgent-2", urgent=True)),
    ]
    # A sleep: the waiters queue behind the holder; the order they are let in is the test.
    await asyncio.sleep(0.01)
    assert order == ["holder"]
    release.set()
    await asyncio.gather(holder, *waiters)
    assert order == ["holder", "urgent-1", "urgent-2", "routine-1", "routine-2"]


async def test_a_cancelled_waiter_loses_no_turn() -> None:
    turns = Turns(1)
    inside = most = 0

    async def take() -> None:
        nonlocal inside, most
        async with turns.turn():
            inside += 1
            most = max(most, inside)
            await asyncio.sleep(0)
            inside -= 1

    held = turns.turn()
    await held.__aenter__()
    gone = asyncio.create_task(take())  # cancelled while it waits
    granted = asyncio.create_task(take())  # cancelled once given its turn, before it runs
    later = asyncio.create_task(take())
    await asyncio.sleep(0)
    gone.cancel()
    await asyncio.sleep(0)
    await held.__aexit__(None, None, None)  # the turn goes to `granted` at once...
    granted.cancel()  # ...which must pass it on
    for task in (gone, granted):
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await asyncio.wait_for(later, 1)
    assert most == 1
    # Every turn came back: the bound is whole again.
    await asyncio.wait_for(asyncio.gather(take(), take()), 1)


async def test_an_engine_receives_urgent_probes_before_routine_ones() -> None:
    # One request at a time; while the first is answered, routine probes queue, then urgent
    # ones: the engine sees the urgent ones next, and every probe gets its answer.
    seen: list[str] = []
    first_in = asyncio.Event()
    answer_first = asyncio.Event()
    body = (
        b"vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"
        b'vllm:engine_sleep_state{sleep_state="awake"} 1\n'
    )

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ")[1].decode()
                seen.append(path.split("who=")[-1].split("&")[0] if "who=" in path else path)
                if len(seen) == 1:
                    first_in.set()
                    await answer_first.wait()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
        writer.close()

    async with await asyncio.start_server(handle, "127.0.0.1", 0) as server:
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/metrics"
        http = EngineHttp(limit=1)
        try:

            def get(who: str, *, urgent: bool = False) -> asyncio.Task[object]:
                return asyncio.create_task(
                    http.request(
                        "GET", url, params=[("who", who)], total=5, connect=5, urgent=urgent
                    )
                )

            tasks = [get("first")]
            await first_in.wait()
            tasks += [get(f"routine-{i}") for i in range(3)]
            # A sleep: the routine asks queue first, so that the urgent ones must pass them.
            await asyncio.sleep(0.01)
            tasks += [get(f"urgent-{i}", urgent=True) for i in range(2)]
            # A sleep: the urgent asks queue too before the first answer frees the turn.
            await asyncio.sleep(0.01)
            answer_first.set()
            answers = await asyncio.wait_for(asyncio.gather(*tasks), 5)
        finally:
            await http.aclose()
    assert all(a.status == 200 for a in answers)  # type: ignore[attr-defined]
    assert seen == ["first", "urgent-0", "urgent-1", "routine-0", "routine-1", "routine-2"]


async def test_the_prober_passes_urgency_on(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[bool] = []

    async def request(self: EngineHttp, *args: object, urgent: bool = False, **_: object) -> None:
        asked.append(urgent)
        raise TimeoutError

    monkeypatch.setattr(EngineHttp, "request", request)
    prober = Prober()
    for urgent in (True, False):
        with contextlib.suppress(Exception):
            await prober.activity("http://10.0.0.1:8000", urgent=urgent)
    assert asked == [True, False]


def test_only_the_first_probe_of_an_engine_that_never_answered_is_urgent() -> None:
    assert first_try(EngineMemory(last_activity=0.0))
    assert not first_try(
        EngineMemory(last_activity=0.0, answered=True)
    )  # known from the status, after a restart
    tried = EngineMemory(last_activity=0.0)
    tried.last_probe = 100.0  # tried once and got nothing: routine from now on
    assert not first_try(tried)
