"""A GPU pool's books against its device: a wake out of memory where the books had room is
blamed on the member that should have freed that memory, which is then counted at its whole
footprint (and restarted where its model says so); a member asleep though Snooze never put it
to sleep is counted whole from the start."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from snooze.api.models import parse_spec
from snooze.api.reasons import FailureReason
from snooze.operator.memory import EngineMemory
from snooze.operator.pool.loop import PoolLoop
from snooze.policy.pool.decision import BOOKS, Member, MemberState
from snooze.policy.pool.trust import Trust
from snooze.policy.sleep import ActionKind, EngineView, ModelView, decide

from .test_pool_members import FOR_C, Source, three_member_pool

GIB = 2**30


def told_pool(
    spec: dict[str, Any], engines: dict[str, EngineMemory]
) -> tuple[PoolLoop, list[Source], list[tuple[str, str, str]]]:
    """three_member_pool, and the Events it tells."""
    told: list[tuple[str, str, str]] = []
    loop, sources = three_member_pool(
        spec, engines, emit=lambda kind, reason, message: told.append((kind, reason, message))
    )
    return loop, sources, told


def sleep_for_c(loop: PoolLoop, engines: dict[str, EngineMemory]) -> None:
    """c asks; a (least recently used) sleeps for it, c is granted, and c's wake runs out of
    memory: a's sleep kept its memory."""
    loop.ask("c", ["c-0"], now=time.time())
    asyncio.run(loop.cycle())
    assert loop.decision is not None and dict(loop.decision.evict) == {"a-0": FOR_C}
    loop.made_room("a-0")
    a = engines["a-0"]
    a.action = "Sleep"

    async def drain() -> None:
        a.task = asyncio.create_task(asyncio.sleep(60))  # an action under way, not a wait
        await loop.cycle()  # a drains
        a.task.cancel()

    asyncio.run(drain())
    a.sleeping, a.drain_started = True, time.time()
    asyncio.run(loop.cycle())
    assert loop.decision.grant == {"c-0"}
    c = engines["c-0"]
    c.last_failure_reason, c.last_failure, c.wake_failures = (
        FailureReason.OUT_OF_MEMORY,
        time.time(),
        1,
    )
    loop.ask("c", ["c-0"], now=time.time())


def engines_for_c() -> dict[str, EngineMemory]:
    return {
        "a-0": EngineMemory(last_activity=0.0, sleeping=False),
        "b-0": EngineMemory(last_activity=100.0, sleeping=False),
        "c-0": EngineMemory(last_activity=0.0, sleeping=True, drain_started=1.0),
    }


def test_the_member_whose_sleep_made_the_room_is_blamed_and_counted_whole() -> None:
    engines = engines_for_c()
    loop, sources, told = told_pool({"memory": "70Gi"}, engines)
    sources[0].spec = parse_spec(
        {
            "selector": {"matchLabels": {"app": "a"}},
            "pool": {"name": "gpu", "memory": "30Gi"},
            "wake": {"onFailure": "Report"},
        }
    )
    sleep_for_c(loop, engines)
    asyncio.run(loop.cycle())
    [(kind, _, message)] = [e for e in told if e[1] == "MemoryNotFreed"]
    assert kind == "Warning" and message.startswith("a-0 (a) said it slept")
    assert "its sleep made the room for that wake" in message
    assert "restart its pod" in message  # its model's remedy is Report: the user restarts it
    assert set(loop.books.trust.untrusted) == {"a-0"}
    # The books count a whole now: more than the device holds. b sleeps to make that good;
    # c (counted whole since its wake failed) waits until it is made good, and a is never
    # asked to sleep again (its sleep frees nothing).
    assert loop.decision is not None and dict(loop.decision.evict) == {"b-0": BOOKS}
    assert not loop.decision.grant
    [wait] = loop.decision.waiting
    assert wait.pod == "c-0" and wait.making_room and "books" in wait.reason
    assert not loop.directive("a-0").restart
    status = loop.written
    assert {m.pod: m.untrusted for m in status.members} == {
        "a-0": True,
        "b-0": False,
        "c-0": False,
    }
    [condition] = [c for c in status.conditions if c.type == "MemoryNotFreed"]
    assert condition.status == "True" and "a-0" in condition.message
    # Once b has slept, c's wake is granted again; the wake out of memory is judged once.
    engines["b-0"].sleeping, engines["b-0"].drain_started = True, time.time()
    asyncio.run(loop.cycle())
    assert loop.decision.grant == {"c-0"}
    assert len([e for e in told if e[1] == "MemoryNotFreed"]) == 1


def test_where_its_model_says_restart_the_member_s_pod_is_restarted() -> None:
    engines = engines_for_c()
    loop, sources, told = told_pool({"memory": "70Gi"}, engines)
    sources[0].spec = parse_spec(
        {
            "selector": {"matchLabels": {"app": "a"}},
            "pool": {"name": "gpu", "memory": "30Gi"},
            "wake": {"onFailure": "Restart"},
        }
    )
    sleep_for_c(loop, engines)
    asyncio.run(loop.cycle())
    assert loop.directive("a-0").restart
    assert any("its pod is restarted" in m for _, r, m in told if r == "MemoryNotFreed")
    # Its model's loop restarts it, whatever else it would have done.
    view = EngineView(
        pod="a-0", ready=True, label=None, sleeping=True, busy=False, last_activity=0.0,
        pooled=True, pool_restart=True,
    )  # fmt: skip
    model = ModelView(spec=sources[0].spec, wake_requested=time.time(), now=time.time())
    [action] = decide([view], model)
    assert (action.kind, action.reason) == (ActionKind.RESTART, FailureReason.MEMORY_NOT_FREED)


def test_a_wake_out_of_memory_before_the_operator_started_is_not_judged() -> None:
    # After a restart of the operator a model's status still says its last wake ran out of
    # memory: nothing is known of who should have freed it, so nobody is blamed.
    engines = engines_for_c()
    engines["c-0"].last_failure_reason = FailureReason.OUT_OF_MEMORY
    engines["c-0"].last_failure = time.time() - 60
    loop, _, told = told_pool({"memory": "70Gi"}, engines)
    asyncio.run(loop.cycle())
    assert not loop.books.trust.untrusted and not [e for e in told if e[1] == "MemoryNotFreed"]


def test_a_member_asleep_that_snooze_never_put_to_sleep_counts_whole() -> None:
    engines = engines_for_c()
    engines["c-0"].drain_started = None  # asleep, and no mark of a sleep of Snooze's
    loop, _, told = told_pool({"memory": "70Gi"}, engines)
    for _ in range(2):
        asyncio.run(loop.cycle())
    [(_, _, message)] = [e for e in told if e[1] == "SleepUnasked"]  # told once
    assert message.startswith("c-0 (c) says it sleeps, but Snooze never put it to sleep")
    assert loop.decision is not None and loop.decision.used == 90 * GIB
    assert {m.pod: m.untrusted for m in loop.written.members}["c-0"]


def member(pod: str, state: MemberState) -> Member:
    return Member(pod=pod, model=pod[0], state=state, footprint=30 * GIB, residue=GIB)


def test_a_wake_granted_into_free_room_blames_the_last_sleep_and_those_never_seen() -> None:
    trust = Trust()
    draining = [member("a-0", MemberState.DRAINING), member("b-0", MemberState.DRAINING)]
    trust.follow([*draining, member("u-0", MemberState.ASLEEP)], {})
    trust.follow([member("a-0", MemberState.ASLEEP), draining[1]], {})
    after = [member(p, MemberState.ASLEEP) for p in ("a-0", "b-0", "u-0")]
    after.append(member("w-0", MemberState.ASLEEP))
    trust.follow(after, {})
    trust.granted("w-0")  # from free room: no sleep was made for it
    [found] = trust.judge(after, {"w-0": 5.0})
    # b's sleep was confirmed last; u-0 and w-0 were asleep when first seen (w-0 failed).
    assert found.suspects == ("b-0", "u-0") and not found.made_room
    assert trust.judge(after, {"w-0": 5.0}) == []  # judged once
