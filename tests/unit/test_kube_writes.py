"""The operator's writes shared fairly between namespaces (kube/writes.py): turns, a wake's
writes first, and each namespace's budget."""

from __future__ import annotations

import asyncio

import pytest

from snooze.kube.writes import FairWrites, WriteYielded, is_urgent, namespace_of, urgent


async def write(
    fair: FairWrites,
    namespace: str,
    done: list[str],
    *,
    label: str,
    hold: asyncio.Event | None = None,
    wake: bool = False,
) -> None:
    async with fair.turn(namespace, urgent=wake):
        done.append(label)
        if hold is not None:
            await hold.wait()


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def unbudgeted(concurrency: int = 1) -> FairWrites:
    return FairWrites(per_model_per_minute=0, burst_per_model=0, concurrency=concurrency)


async def test_namespaces_take_turns_so_one_tenants_queue_is_not_anothers_wait() -> None:
    fair, done, hold = unbudgeted(), [], asyncio.Event()
    first = asyncio.create_task(write(fair, "churn", done, label="churn-0", hold=hold))
    await settle()
    churn = [
        asyncio.create_task(write(fair, "churn", done, label=f"churn-{i}")) for i in range(1, 9)
    ]
    await settle()
    other = asyncio.create_task(write(fair, "calm", done, label="calm"))
    await settle()
    hold.set()
    await asyncio.gather(first, *churn, other)
    # The calm tenant's write comes after one of the churn's eight queued, not after all.
    assert done.index("calm") == 2, done


async def test_a_wakes_writes_go_first() -> None:
    fair, done, hold = unbudgeted(), [], asyncio.Event()
    first = asyncio.create_task(write(fair, "churn", done, label="churn-0", hold=hold))
    await settle()
    queued = [
        asyncio.create_task(write(fair, ns, done, label=f"{ns}-{i}"))
        for i in range(1, 4)
        for ns in ("churn", "calm")
    ]
    await settle()
    wake = asyncio.create_task(write(fair, "churn", done, label="wake", wake=True))
    await settle()
    hold.set()
    await asyncio.gather(first, *queued, wake)
    assert done[1] == "wake", done


async def test_a_namespace_over_its_budget_waits_for_tokens_and_its_wakes_do_not() -> None:
    # One model: 600 writes a minute (ten a second), in bursts of two.
    fair = FairWrites(per_model_per_minute=600, burst_per_model=2, concurrency=8)
    done: list[str] = []
    writes = [asyncio.create_task(write(fair, "churn", done, label=f"w{i}")) for i in range(5)]
    await settle()
    assert done == ["w0", "w1"]  # the burst
    await asyncio.create_task(write(fair, "churn", done, label="wake", wake=True))
    assert done[-1] == "wake"  # no token needed...
    other = asyncio.create_task(write(fair, "calm", done, label="calm"))
    await settle()
    assert done[-1] == "calm"  # ...and another namespace has its own budget
    await asyncio.wait_for(asyncio.gather(*writes), timeout=10)
    assert done[-3:] == ["w2", "w3", "w4"]
    assert fair.waited == 3
    await other


async def test_a_write_cancelled_while_it_waits_gives_its_turn_away() -> None:
    fair, done, hold = unbudgeted(), [], asyncio.Event()
    first = asyncio.create_task(write(fair, "a", done, label="a", hold=hold))
    await settle()
    gone = asyncio.create_task(write(fair, "b", done, label="gone"))
    after = asyncio.create_task(write(fair, "c", done, label="after"))
    await settle()
    gone.cancel()
    hold.set()
    await asyncio.gather(first, after)
    assert done == ["a", "after"] and fair.running == 0
    with pytest.raises(asyncio.CancelledError):
        await gone


def test_the_namespace_of_a_write_is_read_from_its_path() -> None:
    assert namespace_of("/api/v1/namespaces/team-a/pods/p/status") == "team-a"
    assert namespace_of("/apis/snooze.dev/v1alpha1/namespaces/b/inferencemodels/m") == "b"
    assert namespace_of("/apis/apiextensions.k8s.io/v1/customresourcedefinitions") == ""


async def test_urgent_holds_within_its_block_and_its_task() -> None:
    assert not is_urgent()
    with urgent():
        assert is_urgent()
        assert await asyncio.create_task(asyncio.sleep(0, result=is_urgent()))
    assert not is_urgent()


async def test_a_new_model_brings_its_own_burst() -> None:
    models = {"ns": 1}
    fair = FairWrites(per_model_per_minute=0.001, burst_per_model=2, models=lambda ns: models[ns])
    done: list[str] = []
    for i in range(2):
        await write(fair, "ns", done, label=f"first-{i}")
    models["ns"] = 3  # two more models: two more bursts
    for i in range(4):
        await asyncio.wait_for(write(fair, "ns", done, label=f"more-{i}"), timeout=1)
    assert len(done) == 6 and fair.waited == 0


async def test_a_waiting_write_gives_way_when_told_and_nothing_is_written() -> None:
    fair, done, hold = unbudgeted(), [], asyncio.Event()
    first = asyncio.create_task(write(fair, "a", done, label="a", hold=hold))
    await settle()
    wake = asyncio.Event()

    async def status() -> None:
        async with fair.turn("a", urgent=False, yield_to=wake):
            done.append("status")

    waiting = asyncio.create_task(status())
    await settle()
    wake.set()
    with pytest.raises(WriteYielded):
        await waiting
    hold.set()
    await first
    assert done == ["a"] and fair.running == 0
    # One whose turn comes at once never gives way.
    async with fair.turn("a", urgent=False, yield_to=wake):
        done.append("at once")
    assert done == ["a", "at once"]


async def test_a_namespaces_wakes_run_one_burst_into_debt_then_wait_too() -> None:
    fair = FairWrites(per_model_per_minute=600, burst_per_model=2, concurrency=8)
    done: list[str] = []
    wakes = [
        asyncio.create_task(write(fair, "churn", done, label=f"wake-{i}", wake=True))
        for i in range(6)
    ]
    await settle()
    assert done == [f"wake-{i}" for i in range(4)]  # its burst, then one burst of debt
    await asyncio.wait_for(asyncio.gather(*wakes), timeout=10)  # then at the budget's pace
    assert len(done) == 6
