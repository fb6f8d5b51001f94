"""Who a pool counts as its members, and what each holds: read from the model loops' state."""

from __future__ import annotations

from typing import Any

from snooze.gpupool import parse_pool_spec
from snooze.kube.pods import PodInfo, pod_info
from snooze.models import InferenceModelSpec, parse_spec
from snooze.operator.memory import EngineMemory
from snooze.operator.metrics import OperatorMetrics
from snooze.operator.pools import PoolHub, PoolLoop
from snooze.policy.pool import MemberState, PoolDecision

GIB = 2**30


class Source:
    """A model loop as a pool sees it."""

    def __init__(self, name: str, spec: InferenceModelSpec, pods: list[PodInfo]) -> None:
        self.name, self.spec, self.selected = name, spec, pods
        self.engines: dict[str, EngineMemory] = {}

    @property
    def last_wake_seconds(self) -> float | None:
        return None

    def engine_memory(self, pod: str) -> EngineMemory | None:
        return self.engines.get(pod)

    def poke(self) -> None:
        pass


def pod(name: str, **status: Any) -> PodInfo:
    return pod_info(
        {
            "metadata": {"name": name, "namespace": "ns", "labels": {"app": "m"}},
            "spec": {"containers": [{"name": "v", "image": "i"}], **status.pop("spec", {})},
            "status": status,
        }
    )


READY = {
    "phase": "Running",
    "podIP": "10.0.0.1",
    "conditions": [{"type": "Ready", "status": "True"}],
}
POOLED = parse_spec(
    {"selector": {"matchLabels": {"app": "m"}}, "pool": {"name": "gpu", "memory": "30Gi"}}
)


def loop_over(source: Source) -> PoolLoop:
    return PoolLoop(
        namespace="ns",
        name="gpu",
        body={"metadata": {"name": "gpu"}, "spec": {"memory": "70Gi"}},
        api=None,  # type: ignore[arg-type]  # _gather makes no API call
        hub=PoolHub(),
        models=lambda: [source],
        emit=lambda *_: None,
        metrics=OperatorMetrics(),
        interval=1.0,
    )


def test_members_their_states_and_footprints() -> None:
    pods = [
        pod("awake-0", **READY),
        pod("asleep-0", **READY),
        pod("loading-0", phase="Pending", spec={"nodeName": "n1"}),
        pod("unscheduled-0", phase="Pending"),
    ]
    source = Source("m", POOLED, pods)
    source.engines["awake-0"] = EngineMemory(last_activity=0.0, sleeping=False)
    source.engines["asleep-0"] = EngineMemory(last_activity=0.0, sleeping=True)
    members, needs, _ = loop_over(source)._gather(parse_pool_spec({"memory": "70Gi"}), now=100.0)
    states = {m.pod: m.state for m in members}
    assert states == {
        "awake-0": MemberState.AWAKE,
        "asleep-0": MemberState.ASLEEP,
        "loading-0": MemberState.STARTING,  # bound to a node: it takes its memory as it loads
    }  # the unscheduled pod holds nothing on the device
    assert {m.footprint for m in members} == {30 * GIB}
    assert needs["m"].min_awake == 0


def test_the_footprint_falls_back_to_the_engine_then_the_pod_args() -> None:
    spec = parse_spec({"selector": {"matchLabels": {"app": "m"}}, "pool": {"name": "gpu"}})
    args = {"containers": [{"name": "v", "image": "i", "args": ["--gpu-memory-utilization=0.25"]}]}
    from_args = pod("args-0", spec=args, **READY)
    said = pod("said-0", **READY)
    source = Source("m", spec, [from_args, said])
    source.engines["said-0"] = EngineMemory(last_activity=0.0, sleeping=False, gpu_share=0.5)
    members, _, _ = loop_over(source)._gather(parse_pool_spec({"memory": "80Gi"}), now=1.0)
    assert {m.pod: m.footprint for m in members} == {"args-0": 20 * GIB, "said-0": 40 * GIB}


def test_an_eviction_counts_under_what_it_was_chosen_for() -> None:
    """The sleep begins after the decision that chose it may have moved on (the starting
    member it made room for now counted as loading): it still counts as made for a start."""
    spec = parse_spec({"selector": {"matchLabels": {"app": "m"}}, "pool": {"name": "gpu"}})
    source = Source("m", spec, [pod("old-0"), pod("new-0")])
    loop = loop_over(source)
    sources = {"old-0": source, "new-0": source}
    chosen = PoolDecision(
        grant=frozenset(), evict={"old-0": "starting new-0"}, levels={}, waiting=(), used=0
    )
    loop._publish(chosen, [], sources, now=1.0)
    moved_on = PoolDecision(grant=frozenset(), evict={}, levels={}, waiting=(), used=0)
    loop._publish(moved_on, [], sources, now=2.0)
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
    members, _, _ = loop_over(source)._gather(parse_pool_spec({"memory": "70Gi"}), now=100.0)
    assert {m.pod: m.recent_requests for m in members} == {"busy-0": 45, "quiet-0": 1}
