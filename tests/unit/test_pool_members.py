"""Who a pool counts as its members, and what each holds: read from the model loops' state."""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import Mapping
from typing import Any

import builders
import pytest
from prometheus_client import start_http_server

from snooze.api import crd, gpupool, models
from snooze.api.gpupool import GPUPoolSpec, parse_pool_spec
from snooze.api.models import InferenceModelSpec, parse_spec
from snooze.api.modelstatus import merge_patch
from snooze.gateway.metrics import GatewayMetrics
from snooze.kube.pods import PodInfo, pod_info
from snooze.operator.events.emit import Emit
from snooze.operator.handlers.lifecycle import pools_reading
from snooze.operator.memory import EngineMemory, process_of
from snooze.operator.metrics import POOL_EVICTION_REASONS, OperatorMetrics
from snooze.operator.model.knownbugs import sleeps_at
from snooze.operator.pool.loop import PoolHub, PoolLoop
from snooze.operator.pool.members import Gathered, gather
from snooze.operator.pool.snapshot import ModelSnapshot, take_snapshot
from snooze.operator.traffic.gateways import GatewayTraffic
from snooze.policy.knownbugs import ServeFacts
from snooze.policy.pool.decision import (
    HEADROOM,
    PRIME,
    Member,
    MemberState,
    ModelNeeds,
    PoolDecision,
    RoomFor,
    RoomKind,
    Waiting,
)
from snooze.policy.probing import Traffic
from snooze.policy.runs import Process
from snooze.sandbox.validation import Check

GIB = 2**30
FOR_C = RoomFor(RoomKind.WAKE, "c-0")
"""What a member puts to sleep for c-0's wake makes room for."""


class Source:
    """A model loop as a pool sees it: its snapshots, taken from what the test sets here."""

    def __init__(self, name: str, spec: InferenceModelSpec, pods: list[PodInfo]) -> None:
        self.name, self.spec, self.selected = name, spec, pods
        self.engines: dict[str, EngineMemory] = {}
        self.min_awake_now = spec.min_awake
        self.cycled = True

    def snapshot(self, *, pool: str, claims: Mapping[str, str], now: float) -> ModelSnapshot:
        return take_snapshot(
            name=self.name,
            cycled=self.cycled,
            spec=self.spec,
            min_awake_now=self.min_awake_now,
            last_wake_seconds=None,
            selected=self.selected,
            engines=self.engines,
            poke=lambda: None,
            pool=pool,
            claims=claims,
            now=now,
        )


def pod(name: str, **status: Any) -> PodInfo:
    """The builders' pod with this status (and `spec` added to its spec), as the operator
    reads it."""
    spec = status.pop("spec", {})
    return pod_info(
        builders.pod(name=name, namespace="ns", labels={"app": "m"}, spec=spec, status=status)
    )


READY = {
    "phase": "Running",
    "podIP": "10.0.0.1",
    "conditions": [{"type": "Ready", "status": "True"}],
}
POOLED = parse_spec(
    {"selector": {"matchLabels": {"app": "m"}}, "pool": {"name": "gpu", "memory": "30Gi"}}
)


def loop_over(
    source: Source, status: dict[str, Any] | None = None, hub: PoolHub | None = None
) -> PoolLoop:
    return PoolLoop(
        namespace="ns",
        name="gpu",
        body={"metadata": {"name": "gpu"}, "spec": {"memory": "70Gi"}, "status": status or {}},
        api=None,  # type: ignore[arg-type]  # gathered() makes no API call
        hub=hub or PoolHub(),
        models=lambda: [source],
        emit=lambda *_: None,
        metrics=OperatorMetrics(),
        interval=1.0,
    )


def gathered(
    loop: PoolLoop, spec: GPUPoolSpec, now: float
) -> tuple[list[Member], dict[str, ModelNeeds], Gathered]:
    """The pool's members and its models' needs, as its next cycle reads them from its models'
    snapshots."""
    claims = loop.hub.claims("ns")
    models = [m.snapshot(pool=loop.name, claims=claims, now=now) for m in loop.models()]
    found = gather(
        spec,
        models,
        copies=loop.books.copies,
        traffic=lambda pod: loop.hub.traffic("ns", pod),
        now=now,
    )
    return found.members, found.needs, found


def test_members_their_states_and_footprints() -> None:
    pods = [
        pod("awake-0", **READY),
        pod("asleep-0", **READY),
        pod("loading-0", phase="Pending", spec={"nodeName": "n1"}),
        pod("unscheduled-0", phase="Pending"),
    ]
    source = Source("m", POOLED, pods)
    source.engines["awake-0"] = EngineMemory(last_activity=0.0, sleeping=False)
    source.engines["asleep-0"] = EngineMemory(last_activity=0.0, sleeping=True, drain_started=1.0)
    members, needs, _ = gathered(loop_over(source), parse_pool_spec({"memory": "70Gi"}), now=100.0)
    states = {m.pod: m.state for m in members}
    assert states == {
        "awake-0": MemberState.AWAKE,
        "asleep-0": MemberState.ASLEEP,
        "loading-0": MemberState.STARTING,  # bound to a node: it takes its memory as it loads
    }  # the unscheduled pod holds nothing on the device
    assert {m.footprint for m in members} == {30 * GIB}
    assert needs["m"].min_awake == 0
    source.min_awake_now = 1  # a keep-awake window in force: the pool keeps one awake too
    _, needs, _ = gathered(loop_over(source), parse_pool_spec({"memory": "70Gi"}), now=100.0)
    assert needs["m"].min_awake == 1


def test_the_footprint_falls_back_to_the_engine_then_the_pod_args() -> None:
    spec = parse_spec({"selector": {"matchLabels": {"app": "m"}}, "pool": {"name": "gpu"}})
    args = {"containers": [{"name": "v", "image": "i", "args": ["--gpu-memory-utilization=0.25"]}]}
    from_args = pod("args-0", spec=args, **READY)
    said = pod("said-0", **READY)
    source = Source("m", spec, [from_args, said])
    source.engines["said-0"] = EngineMemory(last_activity=0.0, sleeping=False, gpu_share=0.5)
    members, _, _ = gathered(loop_over(source), parse_pool_spec({"memory": "80Gi"}), now=1.0)
    assert {m.pod: m.footprint for m in members} == {"args-0": 20 * GIB, "said-0": 40 * GIB}


def test_a_member_whose_release_cannot_wake_from_level_two_counts_at_level_one() -> None:
    # Its model asks level 2; vLLM 0.8.2 cannot reload weights, so its loop sleeps it at
    # level 1: the pool counts that level, and that it can never discard.
    spec = parse_spec(
        {
            "selector": {"matchLabels": {"app": "m"}},
            "sleep": {"level": 2},
            "pool": {"name": "gpu", "memory": "30Gi"},
        }
    )
    pods = [pod("old-0", **READY), pod("new-0", **READY)]
    source = Source("m", spec, pods)
    for name, release in (("old-0", "0.8.2"), ("new-0", "0.33.0")):
        engine = EngineMemory(last_activity=0.0, sleeping=False)
        engine.sleeps_at = sleeps_at(spec, ServeFacts(version=release))
        source.engines[name] = engine
    members, _, _ = gathered(loop_over(source), parse_pool_spec({"memory": "70Gi"}), now=1.0)
    found = {m.pod: (m.level, m.discards) for m in members}
    assert found == {"old-0": (1, False), "new-0": (2, True)}


def test_an_eviction_counts_under_what_it_was_chosen_for() -> None:
    """The sleep begins after the decision that chose it may have moved on (the starting
    member it made room for now counted as loading): it still counts as made for a start."""
    spec = parse_spec({"selector": {"matchLabels": {"app": "m"}}, "pool": {"name": "gpu"}})
    source = Source("m", spec, [pod("old-0"), pod("new-0")])
    loop = loop_over(source)
    sources = {"old-0": source, "new-0": source}
    chosen = PoolDecision(
        grant=frozenset(),
        evict={"old-0": RoomFor(RoomKind.START, "new-0")},
        levels={},
        waiting=(),
        used=0,
    )
    loop.books.decided(chosen, present=sources)
    moved_on = PoolDecision(grant=frozenset(), evict={}, levels={}, waiting=(), used=0)
    loop.books.decided(moved_on, present=sources)
    loop.made_room("old-0")
    evictions = loop.metrics.pool_evictions
    assert evictions.labels("ns", "gpu", "start")._value.get() == 1
    assert evictions.labels("ns", "gpu", "wake")._value.get() == 0


def test_a_member_carries_its_requests_of_the_last_ten_minutes() -> None:
    source = Source("m", POOLED, [pod("busy-0", **READY), pod("quiet-0", **READY)])
    for name, totals in (("busy-0", (0.0, 30.0, 45.0)), ("quiet-0", (0.0, 0.0, 1.0))):
        engine = source.engines[name] = EngineMemory(last_activity=0.0, sleeping=False)
        for at, total in zip((0.0, 50.0, 90.0), totals, strict=True):
            engine.note_served(total, at)
            engine.success_total = total
    members, _, _ = gathered(loop_over(source), parse_pool_spec({"memory": "70Gi"}), now=100.0)
    assert {m.pod: m.recent_requests for m in members} == {"busy-0": 45, "quiet-0": 1}


def engine_pod(
    name: str, restarts: int | list[int], containers: list[dict[str, Any]] | None = None
) -> PodInfo:
    """A pod whose i-th container restarted restarts[i] times (or restarts + i)."""
    containers = containers or [{"name": "vllm", "image": "i"}]
    counts = restarts if isinstance(restarts, list) else [restarts + i for i in range(9)]
    return pod_info(
        {
            "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
            "spec": {"containers": containers},
            "status": {
                **READY,
                "containerStatuses": [
                    {"name": c["name"], "restartCount": counts[i]} for i, c in enumerate(containers)
                ],
            },
        }
    )


ENGINE = {"name": "engine", "image": "vllm/vllm-openai", "ports": [{"containerPort": 8000}]}
SIDECAR = {"name": "proxy", "image": "envoy", "ports": [{"containerPort": 9901}]}


def test_the_engine_container_and_its_restarts() -> None:
    assert engine_pod("one-0", 3).engine_restarts(8000) == 3  # the only container
    # The engine's container is the one that declares the engine's port, wherever it is.
    assert engine_pod("two-0", 5, [SIDECAR, ENGINE]).engine_restarts(8000) == 6
    assert engine_pod("two-0", 5, [ENGINE, SIDECAR]).engine_restarts(8000) == 5
    # None declaring it, or two: unknown, so a restart never makes the pool forget a copy.
    bare = [{"name": "a", "image": "i"}, {"name": "b", "image": "i"}]
    assert engine_pod("none-0", 1, bare).engine_restarts(8000) is None
    assert engine_pod("both-0", 1, [ENGINE, {**ENGINE, "name": "e2"}]).engine_restarts(8000) is None
    assert engine_pod("other-0", 1, [ENGINE, SIDECAR]).engine_restarts(8080) is None
    assert pod("fresh-0", **READY).engine_restarts(8000) is None  # no container status yet


def test_a_sidecar_that_names_vllm_cannot_make_the_pool_forget_a_copy() -> None:
    """A pod owner's crash-looping sidecar whose arguments mention vLLM and its share flag:
    its restarts are not the engine's, so the copy the engine keeps is still counted."""
    pool_spec = parse_pool_spec({"memory": "70Gi", "hostMemory": "64Gi"})
    decoy = {
        "name": "decoy",
        "image": "busybox",
        "command": ["sh", "-c", "echo vllm serve --gpu-memory-utilization 0.4; exit 1"],
    }
    engine_only_image = {**ENGINE}  # its command is the image's entrypoint: no vllm in spec
    source = Source("m", POOLED, [engine_pod("m-0", [0, 0], [engine_only_image, decoy])])
    engine = source.engines["m-0"] = EngineMemory(last_activity=0.0, sleeping=False)
    loop = loop_over(source)
    engine.note_host_copy(Process("uid-m-0", 0))  # it slept at level 1, then woke
    for at, decoy_restarts in enumerate((1, 2, 7), start=1):
        source.selected = [engine_pod("m-0", [0, decoy_restarts], [engine_only_image, decoy])]
        [member], _, _ = gathered(loop, pool_spec, now=float(at))
        assert member.host_copy
    # Without the port declared, the two containers leave the engine unknown: still counted.
    source.selected = [engine_pod("m-0", [3, 9], [{"name": "engine", "image": "i"}, decoy])]
    [member], _, _ = gathered(loop, pool_spec, now=9.0)
    assert member.host_copy
    # The engine's own container restarted: its process, and the copy, are gone.
    source.selected = [engine_pod("m-0", [1, 9], [engine_only_image, decoy])]
    [member], _, _ = gathered(loop, pool_spec, now=10.0)
    assert not member.host_copy


def test_a_pinned_copy_is_counted_until_the_engine_restarts() -> None:
    """vLLM's level-1 sleep pins a copy of the weights in host RAM; after the wake PyTorch's
    caching host allocator keeps those blocks until the process ends, so the member holds
    that RAM awake too, and a restart of its container gives it back."""
    pool_spec = parse_pool_spec({"memory": "70Gi", "hostMemory": "64Gi"})
    source = Source("m", POOLED, [engine_pod("m-0", 0)])
    engine = source.engines["m-0"] = EngineMemory(last_activity=0.0, sleeping=False)
    loop = loop_over(source)
    [member], _, _ = gathered(loop, pool_spec, now=1.0)
    assert not member.host_copy
    engine.note_host_copy(Process("uid-m-0", 0))  # it slept at level 1, then woke
    [member], _, _ = gathered(loop, pool_spec, now=2.0)
    assert member.host_copy and member.state is MemberState.AWAKE
    source.selected = [engine_pod("m-0", 1)]  # its container restarted
    [member], _, _ = gathered(loop, pool_spec, now=3.0)
    assert not member.host_copy


def stored(status: dict[str, Any], directive: str = "Ignore") -> dict[str, Any]:
    """A pool status as the API server stores it: checked against the CRD's status schema by
    the sandbox's own validation, fields it does not declare dropped (`Ignore`) or refused
    (`Strict`: ApiError)."""
    kept = copy.deepcopy(status)
    Check(
        kind=gpupool.KIND,
        group=models.GROUP,
        version=models.VERSION,
        schema=crd.pool_status_schema(),
        custom=True,
        directive=directive,
    )(kept)
    return kept


def test_the_pool_status_written_says_only_what_its_crd_declares() -> None:
    """The API server would drop the others without a word (a member's pod uid was dropped so,
    and no test checked a host copy after an operator restart)."""
    pool_spec = parse_pool_spec({"memory": "70Gi", "hostMemory": "64Gi"})
    source = Source("m", POOLED, [engine_pod("m-0", 2), engine_pod("m-1", 0)])
    source.engines["m-0"] = EngineMemory(last_activity=0.0, sleeping=False)
    source.engines["m-0"].note_host_copy(Process("uid-m-0", 2))
    source.engines["m-1"] = EngineMemory(last_activity=0.0, sleeping=True, drain_started=1.0)
    loop = loop_over(source)
    members, _, found = gathered(loop, pool_spec, now=1.0)
    loop.books.follow(members, now=1.0, processes=found.processes)
    decision = PoolDecision(
        grant=frozenset(),
        evict={"m-0": RoomFor(RoomKind.WAKE, "m-1")},
        levels={},
        waiting=(),
        used=31 * GIB,
    )
    status = merge_patch(loop._status(pool_spec, members, decision, generation=1, now=1.0))
    assert {m["pod"] for m in status["members"]} == {"m-0", "m-1"}
    stored(status, "Strict")  # raises ApiError naming any field the CRD does not declare


def test_an_operator_restarted_reads_the_copies_from_the_pool_status() -> None:
    pool_spec = parse_pool_spec({"memory": "70Gi", "hostMemory": "64Gi"})
    source = Source("m", POOLED, [engine_pod("m-0", 2)])
    source.engines["m-0"] = EngineMemory(last_activity=0.0, sleeping=False)
    source.engines["m-0"].note_host_copy(Process("uid-m-0", 2))
    first = loop_over(source)
    members, _, found = gathered(first, pool_spec, now=1.0)
    first.books.follow(members, now=1.0, processes=found.processes)
    decision = PoolDecision(grant=frozenset(), evict={}, levels={}, waiting=(), used=30 * GIB)
    status = merge_patch(first._status(pool_spec, members, decision, generation=1, now=1.0))
    [entry] = status["members"]
    assert (entry["hostCopy"], entry["hostBytes"]) == (True, 29 * GIB)
    assert (entry["podUid"], entry["restarts"]) == ("uid-m-0", 2)
    assert (status["hostUsedBytes"], status["hostMemoryBytes"]) == (29 * GIB, 64 * GIB)

    # A new operator process: no memory of the engine, only the status it finds, as the API
    # server stored it (fields its CRD does not declare pruned).
    source.engines["m-0"] = EngineMemory(last_activity=0.0, sleeping=False)
    second = loop_over(source, status=stored(status))
    [member], _, _ = gathered(second, pool_spec, now=2.0)
    assert member.host_copy
    # The same pod, its engine container restarted since that status was written: no copy.
    source.selected = [engine_pod("m-0", 3)]
    [member], _, _ = gathered(second, pool_spec, now=3.0)
    assert not member.host_copy


class NoApi:
    """The pool's status writes, taken and dropped."""

    async def patch(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {}


def model_spec(app: str) -> InferenceModelSpec:
    return parse_spec(
        {"selector": {"matchLabels": {"app": app}}, "pool": {"name": "gpu", "memory": "30Gi"}}
    )


def busy_pool(hub: PoolHub) -> tuple[PoolLoop, list[Source]]:
    """a and b awake and busy fill the pool; c sleeps."""
    sources = [Source(app, model_spec(app), [pod(f"{app}-0", **READY)]) for app in "abc"]
    for source in sources[:2]:
        source.engines[f"{source.name}-0"] = EngineMemory(
            last_activity=0.0, sleeping=False, busy=True, last_probe=5.0
        )
    sources[2].engines["c-0"] = EngineMemory(last_activity=0.0, sleeping=True, drain_started=1.0)
    loop = PoolLoop(
        namespace="ns",
        name="gpu",
        body={"metadata": {"name": "gpu"}, "spec": {"memory": "70Gi"}},
        api=NoApi(),  # type: ignore[arg-type]
        hub=hub,
        models=lambda: sources,
        emit=lambda *_: None,
        metrics=OperatorMetrics(),
        interval=10.0,
    )
    hub.loops[("ns", "gpu")] = loop
    return loop, sources


def test_a_wake_waiting_for_busy_members_reads_every_scrape_of_the_gateway() -> None:
    """Two busy members fill the pool and a third model asks for room: the pool asks for the
    gateway's counters more often, and takes the first scrape that shows a member idle
    (its model's loop, reading them once per interval, still says busy)."""
    hurried: list[float] = []
    scraped = {"a-0": Traffic(sent=3, in_flight=1, last=8.0, at=10.0)}
    scraped["b-0"] = scraped["a-0"]
    hub = PoolHub(hurry=hurried.append, traffic=lambda namespace, pod: scraped.get(pod))
    loop, sources = busy_pool(hub)
    loop.ask("c", ["c-0"], now=11.0)
    asyncio.run(loop.cycle())
    assert loop.decision is not None and not loop.decision.evict
    assert [w.pod for w in loop.decision.waiting] == ["c-0"]
    assert loop.watching and hurried == [10.0]

    # A scrape newer than the loops' probes: b-0's request ended. The pool takes it at once.
    scraped["b-0"] = Traffic(sent=4, in_flight=0, last=12.0, at=12.5)
    asyncio.run(loop.cycle())
    assert dict(loop.decision.evict) == {"b-0": FOR_C}
    assert not loop.watching

    # A probe newer than the scrape that saw the engine busy outranks it.
    sources[1].engines["b-0"].last_probe = 13.0
    asyncio.run(loop.cycle())
    assert not loop.decision.evict and loop.watching


def test_the_start_ups_hub_reads_the_gateway_and_hears_of_each_of_its_scrapes() -> None:
    """The hub the operator's start-up builds reads a real gateway replica's page: a pool that
    waits for busy members hurries the gateway's scraper, and each scrape pokes it."""
    gateway = GatewayMetrics()
    server, thread = start_http_server(0, addr="127.0.0.1", registry=gateway.registry)
    url = f"http://127.0.0.1:{server.server_port}/metrics"
    gateways = GatewayTraffic(api=None, urls=[url], interval=60)
    hub = pools_reading(gateways)
    loop, _ = busy_pool(hub)

    async def scraped_once() -> None:
        task = asyncio.create_task(gateways.run())
        try:
            async with asyncio.timeout(10):
                await loop.poke_event.wait()
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    try:
        with gateway.sending("ns", "a-0"), gateway.sending("ns", "b-0"):
            assert hub.traffic("ns", "a-0") is None  # nothing scraped yet: probes alone judge
            loop.ask("c", ["c-0"], now=11.0)
            asyncio.run(loop.cycle())
            assert loop.watching and gateways.hurried_until > 0
            loop.poke_event.clear()
            asyncio.run(scraped_once())
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    busy = hub.traffic("ns", "a-0")
    assert busy is not None and busy.in_flight == 1
    assert hub.held("ns", "c") == 0


def test_without_a_gateway_the_start_ups_hub_reads_nothing() -> None:
    gateways = GatewayTraffic(api=None, interval=60)
    hub = pools_reading(gateways)
    assert hub.traffic("ns", "a-0") is None and hub.held("ns", "c") is None
    assert gateways.scraped == []


def test_engines_with_traffic_the_gateway_does_not_see_are_judged_by_probes_alone() -> None:
    source = Source("m", POOLED, [pod("direct-0", **READY)])
    engine = source.engines["direct-0"] = EngineMemory(
        last_activity=0.0, sleeping=False, busy=True, last_probe=5.0, direct_activity=True
    )
    scraped = Traffic(sent=0, in_flight=0, last=None, at=9.0)
    loop = loop_over(source, hub=PoolHub(traffic=lambda namespace, pod: scraped))
    [member], _, _ = gathered(loop, parse_pool_spec({"memory": "70Gi"}), now=10.0)
    assert member.busy
    engine.direct_activity = False
    [member], _, _ = gathered(loop, parse_pool_spec({"memory": "70Gi"}), now=10.0)
    assert not member.busy


def three_member_pool(
    spec: dict[str, Any],
    engines: dict[str, EngineMemory],
    status: dict[str, Any] | None = None,
    *,
    hub: PoolHub | None = None,
    emit: Emit = lambda *_: None,
) -> tuple[PoolLoop, list[Source]]:
    """Models a, b and c with one member each (a-0, b-0, c-0), their engines as given; the
    pool's status as the API server has it, if any; its Events to `emit`."""
    sources = [Source(app, model_spec(app), [pod(f"{app}-0", **READY)]) for app in "abc"]
    for source in sources:
        source.engines[f"{source.name}-0"] = engines[f"{source.name}-0"]
    loop = PoolLoop(
        namespace="ns",
        name="gpu",
        body={"metadata": {"name": "gpu"}, "spec": spec, "status": status or {}},
        api=NoApi(),  # type: ignore[arg-type]
        hub=hub or PoolHub(),
        models=lambda: sources,
        emit=emit,
        metrics=OperatorMetrics(),
        interval=10.0,
    )
    return loop, sources


def test_a_primed_member_is_woken_back_then_forgotten() -> None:
    """The pool primes the idle member with no copy; once its engine sleeps, the pool grants it
    its room back (the model's loop wakes it, reason Primed); a wake another model asks for
    meanwhile takes that room first, and the primed member then simply sleeps on."""
    engines = {
        "a-0": EngineMemory(last_activity=0.0, sleeping=False),
        "b-0": EngineMemory(last_activity=0.0, sleeping=False),
        "c-0": EngineMemory(last_activity=0.0, sleeping=True, drain_started=1.0),
    }
    loop, sources = three_member_pool({"memory": "70Gi", "prime": {}}, engines)
    for name in ("b-0", "c-0"):  # they slept at level 1 before: their copies are pinned
        engines[name].note_host_copy(process_of(sources[0].selected[0], 8000))
    asyncio.run(loop.cycle())
    assert loop.decision is not None and dict(loop.decision.evict) == {"a-0": PRIME}
    directive = loop.directive("a-0")
    assert directive.evict and directive.headroom and directive.level == 1
    loop.made_room("a-0")  # its model's loop begins the sleep
    evictions = loop.metrics.pool_evictions
    assert evictions.labels("ns", "gpu", "prime")._value.get() == 1

    engines["a-0"].sleeping, engines["a-0"].sleep_level = True, 1
    engines["a-0"].drain_started = 2.0  # Snooze put it to sleep
    for _ in range(2):  # the grant stands until its loop starts the wake
        asyncio.run(loop.cycle())
        assert loop.decision.grant == {"a-0"} and not loop.decision.waiting
        assert loop.directive("a-0").rewake

    loop.ask("c", ["c-0"], now=50.0)  # a request for c: c's wake takes the room
    asyncio.run(loop.cycle())
    assert loop.decision.grant == {"c-0"} and not loop.directive("a-0").rewake
    loop.ask("c", [], now=51.0)  # c's loop started its wake
    asyncio.run(loop.cycle())
    assert not loop.decision.grant  # a-0 is forgotten: it sleeps on until it is asked for


def test_an_operator_restarted_wakes_back_what_it_primed() -> None:
    """The prime's record is on the pool's status: a new operator process finds the member the
    old one put to sleep to pin its copy, and wakes it back into its room as the old one
    would have."""
    engines = {
        "a-0": EngineMemory(last_activity=0.0, sleeping=False),
        "b-0": EngineMemory(last_activity=0.0, sleeping=False),
        "c-0": EngineMemory(last_activity=0.0, sleeping=True, drain_started=1.0),
    }
    loop, sources = three_member_pool({"memory": "70Gi", "prime": {}}, engines)
    for name in ("b-0", "c-0"):
        engines[name].note_host_copy(process_of(sources[0].selected[0], 8000))

    async def primed_then_stopped() -> dict[str, Any]:
        await loop.cycle()
        assert loop.decision is not None and dict(loop.decision.evict) == {"a-0": PRIME}
        engines["a-0"].action = "Sleep"  # a's loop starts the priming sleep
        engines["a-0"].task = asyncio.create_task(asyncio.sleep(60))  # under way
        loop.made_room("a-0")
        await loop.cycle()  # written while a-0 drains; then the operator stops
        engines["a-0"].task.cancel()
        return stored(merge_patch(loop.written))

    written = asyncio.run(primed_then_stopped())
    assert {m["pod"]: m["primed"] for m in written["members"]} == {
        "a-0": True,
        "b-0": False,
        "c-0": False,
    }
    # The sleep ends while no operator runs; a new one starts, with no memory but the status.
    engines["a-0"].action, engines["a-0"].task = None, None
    engines["a-0"].sleeping, engines["a-0"].sleep_level = True, 1
    engines["a-0"].drain_started = 2.0  # Snooze put it to sleep
    again, _ = three_member_pool({"memory": "70Gi", "prime": {}}, engines, status=written)
    asyncio.run(again.cycle())
    assert again.decision is not None and again.decision.grant == {"a-0"}
    assert again.directive("a-0").rewake
    # c-0, asleep but never primed, sleeps on: only what the status says was primed wakes.
    assert not again.directive("c-0").grant
    assert {m.pod: m.primed for m in again.written.members}["a-0"]


def test_a_drain_that_makes_room_for_a_wake_stays_promised_until_it_ends() -> None:
    """Once a member's drain has begun, the decision no longer lists it (it lists awake members
    to put to sleep): the pool still tells its model's loop that this drain makes room for a
    wake, so that a request for the member does not cancel it and take the room back. A drain
    for headroom or a prime stays cancellable."""
    engines = {
        "a-0": EngineMemory(last_activity=0.0, sleeping=False),
        "b-0": EngineMemory(last_activity=100.0, sleeping=False),
        "c-0": EngineMemory(last_activity=0.0, sleeping=True, drain_started=1.0),
    }
    loop, _ = three_member_pool({"memory": "70Gi"}, engines)

    async def scenario() -> None:
        loop.ask("c", ["c-0"], now=200.0)
        await loop.cycle()
        assert loop.decision is not None and dict(loop.decision.evict) == {"a-0": FOR_C}
        # a's loop starts the sleep (the action's task runs), which begins the drain.
        engines["a-0"].action = "Sleep"
        engines["a-0"].task = asyncio.create_task(asyncio.sleep(60))  # under way
        loop.made_room("a-0")
        await loop.cycle()
        assert "a-0" not in loop.decision.evict  # draining: not an awake member any more
        directive = loop.directive("a-0")
        assert directive.promised and not directive.headroom
        # The sleep ends (confirmed): the promise ends with it.
        engines["a-0"].task.cancel()
        engines["a-0"].sleeping, engines["a-0"].drain_started = True, 2.0
        await asyncio.sleep(0)
        await loop.cycle()
        assert not loop.directive("a-0").promised

    asyncio.run(scenario())


def test_a_drain_for_headroom_is_not_promised() -> None:
    source = Source("m", POOLED, [pod("a-0", **READY)])
    loop = loop_over(source)
    chosen = PoolDecision(grant=frozenset(), evict={"a-0": HEADROOM}, levels={}, waiting=(), used=0)
    loop.books.decided(chosen, present={"a-0"})
    loop.made_room("a-0")
    assert not loop.directive("a-0").promised


def test_a_member_spared_as_busy_is_not_chosen_again_on_an_older_scrape() -> None:
    """A member chosen on the gateway's counters and found busy by its loop's check before the
    sleep is spared. That check is newer than the scrape: the pool must not choose the same
    member again on the scrape. It did (the action's end clears last_probe, which dropped the
    check), so it kept "making room" with a member it could not take, did not watch the
    counters closely, and the wake waited for the longer of two streams, not the first."""
    engines = {
        "a-0": EngineMemory(last_activity=0.0, sleeping=False),
        "b-0": EngineMemory(last_activity=5.0, sleeping=False, busy=True, last_probe=11.5),
        "c-0": EngineMemory(last_activity=0.0, sleeping=True, drain_started=1.0),
    }
    hurried: list[float] = []
    # The last scrape, from before the streams began, says both idle; b's probe since says busy.
    idle = {"a-0": Traffic(sent=1, in_flight=0, last=1.0, at=10.0)}
    idle["b-0"] = Traffic(sent=1, in_flight=0, last=5.0, at=10.0)
    hub = PoolHub(hurry=hurried.append, traffic=lambda namespace, pod: idle.get(pod))
    loop, _ = three_member_pool({"memory": "70Gi"}, engines, hub=hub)
    loop.ask("c", ["c-0"], now=11.0)
    asyncio.run(loop.cycle())
    assert loop.decision is not None and dict(loop.decision.evict) == {"a-0": FOR_C}
    # a's loop checks before the sleep: busy, so a is spared, as the executor does it; the
    # action's end then clears last_probe (confirm with a probe).
    engines["a-0"].saw_busy(now=12.0)
    engines["a-0"].last_probe = None
    asyncio.run(loop.cycle())
    assert not loop.decision.evict  # both busy: nothing to choose
    assert [w.pod for w in loop.decision.waiting] == ["c-0"]
    assert loop.watching and hurried  # the counters are read often until one ends
    # A newer scrape: a's stream ended. The pool takes it.
    idle["a-0"] = Traffic(sent=2, in_flight=0, last=13.0, at=13.5)
    asyncio.run(loop.cycle())
    assert dict(loop.decision.evict) == {"a-0": FOR_C}


def test_a_wake_whose_requests_are_all_gone_keeps_no_place_until_they_come_back() -> None:
    held = {"c": 0}
    hurried: list[float] = []
    hub = PoolHub(
        held=lambda namespace, model: held.get(model) if namespace == "ns" else None,
        hurry=hurried.append,
    )
    loop, _ = busy_pool(hub)
    loop.ask("c", ["c-0"], now=11.0)

    def waiting() -> Waiting:
        asyncio.run(loop.cycle())
        assert loop.decision is not None
        [wait] = loop.decision.waiting
        return wait

    # Asked by hand (kubectl annotate): the gateway never held a request for it. It waits.
    assert not waiting().abandoned and loop.watching
    held["c"] = 2  # requests held for c
    assert not waiting().abandoned
    held["c"] = 0  # their clients gave up
    gone = waiting()
    assert gone.abandoned and "gone" in gone.reason
    assert not loop.watching  # nobody waits for it: no hurried scrapes on its account
    assert loop.books.asks["c-0"].at == 11.0
    held["c"] = 1  # a new request: it asks anew, behind the wakes asked meanwhile
    assert not waiting().abandoned
    assert loop.books.asks["c-0"].at > 11.0


def test_a_member_woken_for_a_wake_remembers_when_that_wake_was_asked() -> None:
    hub = PoolHub()
    loop, sources = busy_pool(hub)
    sources[0].engines["a-0"].busy = False  # a may make room for c now
    loop.ask("c", ["c-0"], now=11.0)
    asyncio.run(loop.cycle())
    assert loop.decision is not None and dict(loop.decision.evict) == {"a-0": FOR_C}
    sources[0].engines["a-0"].sleeping = True  # a slept for it (Snooze drained it)
    sources[0].engines["a-0"].drain_started = 12.0
    asyncio.run(loop.cycle())
    assert loop.decision.grant == {"c-0"}
    sources[2].engines["c-0"].sleeping = False  # c woke
    loop.ask("c", [], now=13.0)
    members, _, _ = gathered(loop, parse_pool_spec({"memory": "70Gi"}), now=14.0)
    [c] = [m for m in loop.books.follow(members, now=14.0).members if m.pod == "c-0"]
    assert c.woken_for == 11.0
    sources[2].engines["c-0"].sleeping = True  # asleep again: it passed nobody any more
    asyncio.run(loop.cycle())
    members, _, _ = gathered(loop, parse_pool_spec({"memory": "70Gi"}), now=15.0)
    assert all(m.woken_for is None for m in loop.books.follow(members, now=15.0).members)


@pytest.mark.parametrize("name", ["headroom", "prime", "starting", "start", "wake", "books"])
def test_a_model_and_pod_named_like_a_marker_of_the_pool_change_nothing(name: str) -> None:
    """A model (and its pod) named like a word the pool uses for itself: its wake puts a
    member to sleep as any wake does: counted as a wake, told as one, and a request for that
    member cannot cancel the drain that makes the promised room."""
    sources = [Source(app, model_spec(app), [pod(f"{app}-0", **READY)]) for app in "ab"]
    for source in sources:
        source.engines[f"{source.name}-0"] = EngineMemory(last_activity=0.0, sleeping=False)
    named = Source(name, model_spec(name), [pod(name, **READY)])
    named.engines[name] = EngineMemory(last_activity=0.0, sleeping=True, drain_started=1.0)
    told: list[str] = []
    loop = PoolLoop(
        namespace="ns",
        name="gpu",
        body={"metadata": {"name": "gpu"}, "spec": {"memory": "70Gi"}},
        api=NoApi(),  # type: ignore[arg-type]
        hub=PoolHub(),
        models=lambda: [*sources, named],
        emit=lambda kind, reason, message: told.append(message),
        metrics=OperatorMetrics(),
        interval=10.0,
    )
    loop.ask(name, [name], now=1.0)
    asyncio.run(loop.cycle())
    assert loop.decision is not None
    [(evicted, room)] = loop.decision.evict.items()
    assert room == RoomFor(RoomKind.WAKE, name)
    loop.made_room(evicted)
    evictions = loop.metrics.pool_evictions
    counted = {r: evictions.labels("ns", "gpu", r)._value.get() for r in POOL_EVICTION_REASONS}
    assert counted == {r: float(r == "wake") for r in POOL_EVICTION_REASONS}
    assert told == [f"{evicted} ({evicted[0]}) sleeps to make room for {name}"]
    directive = loop.directive(evicted)
    assert directive.promised and not directive.headroom  # the drain is not cancelled
    asyncio.run(loop.cycle())
    assert not any(m.primed for m in loop.written.members)


class Writes:
    """The pool's status writes, kept."""

    def __init__(self) -> None:
        self.statuses: list[dict[str, Any]] = []

    async def patch(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.statuses.append(args[2]["status"])
        return {}


def test_a_restarted_operator_s_pool_waits_for_every_model_then_keeps_the_copies() -> None:
    """After a restart of the operator, a pool's loop may cycle before a model's loop has: it
    knew none of that model's pods, and the status it wrote then forgot their host copies (a
    member that should have slept at level 2 slept at level 1). It decides and writes nothing
    until every model of its namespace has cycled; and a member missing from one cycle keeps
    its copy."""
    spec = {"memory": "70Gi", "hostMemory": "64Gi"}
    before = Source("m", POOLED, [engine_pod("m-0", 2)])
    before.engines["m-0"] = EngineMemory(last_activity=0.0, sleeping=False)
    before.engines["m-0"].note_host_copy(Process("uid-m-0", 2))
    first = loop_over(before)
    members, _, found = gathered(first, parse_pool_spec(spec), now=1.0)
    first.books.follow(members, now=1.0, processes=found.processes)
    decision = PoolDecision(grant=frozenset(), evict={}, levels={}, waiting=(), used=30 * GIB)
    written = stored(merge_patch(first._status(parse_pool_spec(spec), members, decision, 1, 1.0)))

    # The new operator: the model's loop has not cycled yet (it knows no pod, no copy).
    source = Source("m", POOLED, [])
    source.cycled = False
    source.engines["m-0"] = EngineMemory(last_activity=0.0, sleeping=False)
    writes = Writes()
    expected = ["m", "other"]  # "other" has no loop yet either
    loop = PoolLoop(
        namespace="ns",
        name="gpu",
        body={"metadata": {"name": "gpu"}, "spec": spec, "status": written},
        api=writes,  # type: ignore[arg-type]
        hub=PoolHub(),
        models=lambda: [source],
        emit=lambda *_: None,
        metrics=OperatorMetrics(),
        interval=10.0,
        expected=lambda: expected,
    )
    asyncio.run(loop.cycle())
    assert loop.decision is None and not writes.statuses
    source.cycled, source.selected = True, [engine_pod("m-0", 2)]
    asyncio.run(loop.cycle())
    assert loop.decision is None and not writes.statuses  # "other" has not cycled yet
    expected.remove("other")  # (deleted meanwhile)
    asyncio.run(loop.cycle())
    [entry] = writes.statuses[-1]["members"]
    assert entry["hostCopy"] and writes.statuses[-1]["hostUsedBytes"] == 29 * GIB

    # Its pod missing from one cycle (its loop restarted): the copy is not forgotten.
    source.selected = []
    asyncio.run(loop.cycle())
    assert writes.statuses[-1]["members"] == []
    source.selected = [engine_pod("m-0", 2)]
    asyncio.run(loop.cycle())
    [entry] = writes.statuses[-1]["members"]
    assert entry["hostCopy"]
