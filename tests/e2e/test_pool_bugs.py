"""GPU pool bugs that benchmarks/pools.py ran into (benchmarks/HISTORY.md, points 4 to 6), each
shown on one pool coordinator (PoolLoop) in front of simulated engines on one shared device,
with the operator's own Executor doing the wakes: no Kubernetes API is needed (its patches
succeed).

Each failed before its fix (bug A: a grant dropped; B: a member the operator woke counted
asleep; C: a member whose wake ran out of memory never granted again)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any

import httpx

from snooze.api.models import InferenceModelSpec, parse_spec
from snooze.engine.client import EngineHttp, new_http_client
from snooze.kube.pods import PodInfo
from snooze.operator.memory import EngineMemory, ModelMemory
from snooze.operator.metrics import OperatorMetrics
from snooze.operator.model.actions import Executor
from snooze.operator.pool.loop import PoolHub, PoolLoop
from snooze.operator.pool.snapshot import ModelSnapshot, take_snapshot
from snooze.operator.settings import Settings
from snooze.policy.sleep import Action, ActionKind, ActionReason
from snooze.sim import EngineConfig, SimulatedEngine, SimulatorHost

from .conftest import _addresses

GIB = 2**30


class Api:
    """The Kubernetes API as the coordinator and the Executor use it: every patch succeeds."""

    async def patch(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {}


class Member:
    """One model with one pod on the pool: its snapshots, as a model loop hands them to the
    coordinator."""

    def __init__(self, name: str, engine: SimulatedEngine) -> None:
        self.name = name
        self.engine = engine
        self.spec: InferenceModelSpec | None = parse_spec(
            {"selector": {"matchLabels": {"app": name}}, "pool": {"name": "gpu", "memory": "30Gi"}}
        )
        # Slept by hand here, as Snooze would have: its pod carries the mark of a drain.
        self.pod = PodInfo(
            namespace="default",
            name=f"{name}-0",
            uid=name,
            ready=True,
            ip=engine.config.host,
            sleep_started=1.0,
        )
        self.selected = [self.pod]
        self.min_awake_now = 0
        self.cycled = True
        self.memory = ModelMemory()
        self.last_wake_seconds: float | None = 0.01
        self.probe()

    @property
    def state(self) -> EngineMemory:
        return self.memory.engine(self.pod.name, now=0.0)

    def probe(self) -> None:
        """What the model loop's probe records: whether the engine sleeps."""
        self.state.sleeping = self.engine.is_sleeping

    def snapshot(self, *, pool: str, claims: Mapping[str, str], now: float) -> ModelSnapshot:
        return take_snapshot(
            name=self.name,
            cycled=self.cycled,
            spec=self.spec,
            min_awake_now=self.min_awake_now,
            last_wake_seconds=self.last_wake_seconds,
            selected=self.selected,
            engines=self.memory.engines,
            poke=lambda: None,
            pool=pool,
            claims=claims,
            now=now,
        )

    async def wake(self, http: EngineHttp) -> None:
        """The operator's wake of this member (label, /wake_up, confirm, label), to its end."""
        executor = Executor(
            namespace="default",
            api=Api(),  # type: ignore[arg-type]
            http=http,
            memory=self.memory,
            settings=Settings(),
            emit=lambda *_: None,
            metrics=OperatorMetrics(),
            model=self.name,
        )
        action = Action(
            kind=ActionKind.WAKE, pod=self.pod.name, reason=ActionReason.WAKE_REQUESTED, level=1
        )
        assert self.spec is not None
        executor.start(action, self.pod, self.spec)
        task = self.state.task
        assert task is not None
        await task


def pool_of(members: Iterable[Member]) -> PoolLoop:
    listed = list(members)
    return PoolLoop(
        namespace="default",
        name="gpu",
        body={"spec": {"memory": "70Gi", "minResidency": "1s"}},
        api=Api(),  # type: ignore[arg-type]
        hub=PoolHub(),
        models=lambda: listed,
        emit=lambda *_: None,
        metrics=OperatorMetrics(),
        interval=10,
    )


def three_on_one_device(sim: SimulatorHost) -> dict[str, Member]:
    """a awake, b and c asleep; 30 GiB each awake, 1 GiB asleep, on 70 GiB: two fit."""
    sim.add_device(name="gpu", memory_gib=70)
    engines = {}
    for name in "abc":
        config = EngineConfig(
            model=name,
            host=next(_addresses),
            device="gpu",
            gpu_memory_gib=10,
            kv_cache_gib=19,
            asleep_memory_gib=1,
            sleep_seconds=0.01,
            wake_seconds=0.01,
            kv_wake_seconds=0.01,
            checksum_seconds_per_gib=0.001,
        )
        engines[name] = engine = sim.add(config)
        if name != "a":
            httpx.post(f"{engine.url}/sleep?level=1").raise_for_status()
    return {name: Member(name, engine) for name, engine in engines.items()}


def test_a_granted_wake_keeps_its_room_until_the_member_starts_waking(sim: SimulatorHost) -> None:
    members = three_on_one_device(sim)
    httpx.post(f"{members['b'].engine.url}/wake_up").raise_for_status()
    members["b"].probe()  # a and b awake, c asleep: the device is full
    pool = pool_of(members.values())

    async def run() -> None:
        pool.ask("c", ["c-0"], now=1.0)
        await pool.cycle()
        assert pool.decision is not None and set(pool.decision.evict) == {"a-0"}
        async with httpx.AsyncClient() as http:
            (await http.post(f"{members['a'].engine.url}/sleep?level=1")).raise_for_status()
        members["a"].probe()  # a sleeps for c
        await pool.cycle()
        assert pool.decision is not None and pool.decision.grant == {"c-0"}
        pool.ask("a", ["a-0"], now=2.0)  # a request for a, after c's
        await pool.cycle()  # before c's own loop has acted on its grant
        assert pool.decision is not None
        assert pool.decision.grant == {"c-0"}, "the room made for c went to a, who asked later"

    asyncio.run(run())


def test_a_member_the_operator_woke_counts_awake_before_its_next_probe(sim: SimulatorHost) -> None:
    members = three_on_one_device(sim)
    pool = pool_of(members.values())

    async def run() -> None:
        async with new_http_client() as http:
            pool.ask("b", ["b-0"], now=1.0)
            await pool.cycle()
            assert pool.decision is not None and pool.decision.grant == {"b-0"}
            await members["b"].wake(http)
            assert not members["b"].engine.is_sleeping
            pool.ask("c", ["c-0"], now=2.0)  # before b's loop probes b again
            await pool.cycle()
            assert pool.decision is not None
            held = members["a"].engine.device.used_bytes
            assert pool.decision.used == held, "the pool counts b at its residue, not awake"
            assert pool.decision.grant == frozenset(), "c granted: its wake would run out of memory"

    asyncio.run(run())


def test_a_member_whose_wake_ran_out_of_memory_can_wake_once_there_is_room(
    sim: SimulatorHost,
) -> None:
    members = three_on_one_device(sim)
    httpx.post(f"{members['b'].engine.url}/wake_up").raise_for_status()
    members["b"].probe()  # a and b awake: no room for c

    async def run() -> None:
        async with new_http_client() as http:
            await members["c"].wake(http)  # as a wake granted in error would
            assert members["c"].state.last_failure_reason == "OutOfMemory"
            assert members["c"].engine.memory.oom_total["wake"] == 1
            async with httpx.AsyncClient() as user:
                for name in "ab":  # the others sleep: the device is free but for the residues
                    url = f"{members[name].engine.url}/sleep?level=1"
                    (await user.post(url)).raise_for_status()
            for member in members.values():
                member.probe()
            assert members["a"].engine.device.used_bytes < 40 * GIB
            pool = pool_of(members.values())
            pool.ask("c", ["c-0"], now=1.0)
            await pool.cycle()
            assert pool.decision is not None
            assert pool.decision.grant == {"c-0"}, "c is never granted its wake again"

    asyncio.run(run())
