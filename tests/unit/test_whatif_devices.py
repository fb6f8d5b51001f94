"""Devices held, computed by hand: a model's own device while any of its pods exists (sleep
gives nothing back, scale to zero does, less the cold start), a pool's one device for all its
members; and a pool replayed through its real decision: who sleeps for whom, the waits for
room and what they add to requests."""

from __future__ import annotations

from pathlib import Path

import pytest

from snooze.policy.pool.decision import Prime
from snooze.whatif import layout, policies, report, trace
from snooze.whatif.latency import Latencies
from snooze.whatif.pooling import Footprint, PoolSettings

LAT = Latencies()
GIB = 2**30
SERVICE = 16 * 0.02
WAKE_1 = 0.3 + 0.05
SLEEP = 5.7  # an engine's first level-1 sleep
SLEEP_AGAIN = 5.7 * (1 - 0.86)  # its later ones
MEMBER = Footprint(memory=36 * GIB, asleep=2 * GIB, weights=34 * GIB)


def simulate(policy: str, requests: list[tuple[float, str]], **kw: object) -> report.Result:
    trace_ = [trace.Request(at=t, model=m) for t, m in requests]
    return report.evaluate(policies.parse(policy), trace_, latencies=LAT, **kw)  # type: ignore[arg-type]


def pool_of(*models: str, memory: int = 40, **settings: object) -> layout.Layout:
    return layout.Layout(
        pools=[
            layout.PoolLayout(
                settings=PoolSettings(name="gpu", memory=memory * GIB, **settings),  # type: ignore[arg-type]
                members=dict.fromkeys(models, MEMBER),
            )
        ]
    )


def test_sleep_on_a_device_of_its_own_gives_no_device_back() -> None:
    # As test_whatif's fixed TTL: asleep from 706.02 to 2000, yet its pod holds the device
    # all along, to the held request's answer at 2000.67.
    result = simulate("fixed:10m", [(0, "m"), (100, "m"), (2000, "m")])
    assert result.device_hours_held * 3600 == pytest.approx(2000 + WAKE_1 + SERVICE, abs=1e-3)
    assert result.gpu_hours_awake < 0.36 * result.device_hours_held
    assert result.devices_peak == result.devices_always_on == 1
    always = simulate("always-on", [(0, "m"), (100, "m"), (2000, "m")])
    assert always.device_hours_held * 3600 == pytest.approx(2000 + SERVICE, abs=1e-3)


def test_scale_to_zero_gives_the_device_back_but_the_cold_start() -> None:
    # Asleep at 66.02, at zero replicas at 120.32 (2m after the last activity): the device is
    # given back; the request at 1000 scales it up, and its pod holds the device through the
    # 60 s cold start to the answer at 1060.32.
    result = simulate("tiers:1m,2m", [(0, "m"), (1000, "m")])
    assert result.device_hours_held * 3600 == pytest.approx(120 + SERVICE + 60 + SERVICE,
                                                            abs=1e-3)  # fmt: skip
    assert result.devices_peak == 1


@pytest.mark.parametrize(("second", "peak"), [(2000.0, 1), (1100.0, 2)])
def test_the_peak_counts_devices_held_at_once(second: float, peak: int) -> None:
    # Counted from 500, when both models are at zero: `a` holds its device from 1000 (scale-up)
    # to 1180.32 (2m after its answer at 1060.32) or the span's end (the last request);
    # `b` from `second` to its answer 60.32 s later: apart, or at once.
    result = simulate(
        "tiers:1m,2m", [(0, "a"), (0, "b"), (1000, "a"), (second, "b")], measure_from=500.0
    )
    a = min(180 + SERVICE, second - 1000)
    b = 60 + SERVICE
    assert result.device_hours_held * 3600 == pytest.approx(a + b, abs=1e-3)
    assert result.devices_peak == peak


def test_a_pool_holds_one_device_and_swaps_its_members() -> None:
    # Two members of 36 GiB on 40: one awake at a time (`a`, the first asked for, starts
    # awake; `b` asleep, having slept once). Each request finds its model asleep and waits
    # for the other's sleep, then its own wake: a's first sleep pins host RAM (5.7 s), every
    # later one reuses it.
    result = simulate(
        "always-on",
        [(0, "a"), (100, "b"), (200, "a"), (300, "b")],
        layout=pool_of("a", "b", min_residency=0.0),
    )
    held = sorted(result.per_model["a"].held) + sorted(result.per_model["b"].held)
    assert held == pytest.approx(
        [SLEEP_AGAIN + WAKE_1, SLEEP_AGAIN + WAKE_1, SLEEP + WAKE_1], abs=1e-3
    )
    assert result.swaps == 3 and result.wakes == 3 and result.waits_for_room == 3
    assert result.wait_for_room_p99_s == pytest.approx(SLEEP, abs=1e-3)
    assert result.added_latency_p99_s == pytest.approx(SLEEP + WAKE_1, abs=1e-3)
    # One device to the last answer (300 + its wait + its service), against two of their own.
    end = 300 + SLEEP_AGAIN + WAKE_1 + SERVICE
    assert result.device_hours_held * 3600 == pytest.approx(end, abs=1e-3)
    assert result.devices_peak == result.devices_always_on == 1
    # One engine awake at every instant: awake hours add up to the device's.
    assert result.gpu_hours_awake == pytest.approx(result.device_hours_held, abs=1e-6)
    # Always on, each to the span's end (the last request) or its own last answer after it.
    assert result.gpu_hours_always_on * 3600 == pytest.approx(300 + 300 + SERVICE, abs=1e-3)


def test_min_residency_keeps_the_woken_member_and_the_wake_waits() -> None:
    # `a` is resident from the start: b's request at 10 waits until 30 (minResidency), then
    # a's first sleep, then its own wake.
    result = simulate(
        "always-on", [(0, "a"), (10, "b")], layout=pool_of("a", "b", min_residency=30.0)
    )
    assert list(result.per_model["b"].held) == pytest.approx([20 + SLEEP + WAKE_1], abs=1e-3)


def test_members_that_fit_together_never_swap() -> None:
    result = simulate(
        "fixed:1m", [(0, "a"), (0, "b"), (500, "a")], layout=pool_of("a", "b", memory=80)
    )
    assert result.swaps == 0 and result.waits_for_room == 0
    # Slept as idle and woken on request, as on devices of their own, but on one device.
    assert result.wakes == 1 and result.held_requests == 1
    assert result.devices_always_on == 1
    assert result.device_hours_held * 3600 == pytest.approx(500 + WAKE_1 + SERVICE, abs=1e-3)


def test_a_model_outside_every_pool_keeps_its_own_device() -> None:
    result = simulate(
        "always-on",
        [(0, "a"), (0, "b"), (0, "c"), (100, "c")],
        layout=pool_of("a", "b", memory=80),
    )
    assert result.devices_always_on == 2 and result.devices_peak == 2
    # The pool's device to the span's end (the last request), c's to its answer.
    assert result.device_hours_held * 3600 == pytest.approx(100 + 100 + SERVICE, abs=1e-3)


def test_scale_to_zero_in_a_pool_is_refused() -> None:
    with pytest.raises(policies.PolicyError, match="does not replay scale to zero inside"):
        simulate("tiers:1m,2m", [(0, "a"), (1, "b")], layout=pool_of("a", "b"))


POOL = """
apiVersion: snooze.dev/v1alpha1
kind: GPUPool
metadata: {name: shared}
spec: {memory: 40Gi, minResidency: 1ms, prime: {idleAfter: 5s}}
---
apiVersion: snooze.dev/v1alpha1
kind: InferenceModel
metadata: {name: alpha}
spec:
  modelName: a
  selector: {matchLabels: {app: a}}
  idle: {after: Never}
  pool: {name: shared, memory: 36Gi, asleepMemory: 2Gi, priority: 5}
---
apiVersion: snooze.dev/v1alpha1
kind: InferenceModel
metadata: {name: b}
spec:
  selector: {matchLabels: {app: b}}
  idle: {after: 1m}
  pool: {name: shared, memory: 36Gi, asleepMemory: 2Gi}
"""


def test_pools_from_the_manifests_a_user_applies(tmp_path: Path) -> None:
    path = tmp_path / "pool.yaml"
    path.write_text(POOL)
    read = layout.from_manifests([path])
    [pool] = read.pools
    assert pool.settings.memory == 40 * GIB and pool.settings.min_residency == 0.001
    assert pool.settings.prime is not None and pool.settings.prime.idle_after == 5
    assert pool.members == {
        "a": Footprint(memory=36 * GIB, asleep=2 * GIB, weights=34 * GIB, priority=5),
        "b": Footprint(memory=36 * GIB, asleep=2 * GIB, weights=34 * GIB),
    }
    # As declared: a (primed at 5 s: slept once and woken back while the pool was quiet)
    # makes room for b's request in a later sleep only; b sleeps as idle a minute after its
    # request, so a's request at 200 finds room and waits for its own wake alone.
    result = report.evaluate(
        policies.declared(read.specs),
        [trace.Request(at=t, model=m) for t, m in ((0, "a"), (100, "b"), (200, "a"))],
        latencies=LAT,
        layout=read,
    )
    held = list(result.per_model["b"].held) + list(result.per_model["a"].held)
    assert held == pytest.approx([SLEEP_AGAIN + WAKE_1, WAKE_1], abs=1e-3)
    assert result.swaps == 1 and result.per_model["a"].swaps == 1


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (POOL.replace("memory: 40Gi", "memory: 30Gi"),
         "a takes 36GiB awake and the others 2GiB asleep"),
        (POOL.replace("name: shared, memory: 36Gi", "name: other, memory: 36Gi", 1),
         "names GPUPool 'other' in namespace 'default', which no manifest given defines"),
        (POOL.replace("memory: 36Gi, asleepMemory: 2Gi, priority: 5", "asleepMemory: 2Gi"),
         "spec.pool.memory is needed"),
        (POOL.replace("minResidency: 1ms", "minResidency: soon"),
         "GPUPool shared: spec.minResidency"),
        ("kind: [", "not YAML"),
    ],
)  # fmt: skip
def test_bad_manifests_are_refused_naming_the_document(
    tmp_path: Path, text: str, says: str
) -> None:
    path = tmp_path / "pool.yaml"
    path.write_text(text)
    with pytest.raises(layout.LayoutError, match=says):
        layout.from_manifests([path])


def test_pools_from_flags() -> None:
    default, named = layout.memory_of(["36Gi,2Gi", "m=a=20Gi"])
    assert default == MEMBER
    assert named == {"m=a": Footprint(memory=20 * GIB, asleep=GIB, weights=19 * GIB)}
    made = layout.from_flags(
        ["gpu-0=m=a,b"],
        device_memory=80 * GIB,
        memory=["36Gi,2Gi", "m=a=20Gi"],
        models=["m=a", "b", "c"],
        flags=layout.PoolFlags(min_residency=2.0),
    )
    assert made.pools[0].settings.min_residency == 2.0
    with pytest.raises(layout.LayoutError, match="the trace has no model 'z'"):
        layout.from_flags(
            ["gpu-0=z"], device_memory=GIB, memory=["1Gi,0.5Gi"], models=["a"],
            flags=layout.PoolFlags(),
        )  # fmt: skip
    with pytest.raises(layout.LayoutError, match="how much memory does b take"):
        layout.from_flags(
            ["gpu-0=a,b"], device_memory=GIB, memory=["a=1Gi,0.5Gi"], models=["a", "b"],
            flags=layout.PoolFlags(),
        )  # fmt: skip
    with pytest.raises(layout.LayoutError, match="a sleeping engine holds less"):
        layout.memory_of(["2Gi,3Gi"])


def test_a_prime_comes_once_the_member_is_idle_and_past_its_residency() -> None:
    # a is primed at 30 s (minResidency, not 10 s idle), sleeps its first, slow sleep then,
    # and is woken back: b's request at 100 waits only a later sleep of a's and its own wake.
    result = simulate(
        "always-on",
        [(0, "a"), (100, "b")],
        layout=pool_of("a", "b", min_residency=30.0, prime=Prime(idle_after=10.0)),
    )
    assert list(result.per_model["b"].held) == pytest.approx([SLEEP_AGAIN + WAKE_1], abs=1e-3)
    assert result.per_model["a"].wakes == 1  # the wake back, into its own room
    assert result.swaps == 1  # the prime is no swap


@pytest.mark.parametrize("names", [("a", "b"), ("prime", "headroom"), ("headroom", "prime")])
def test_a_model_named_like_the_pools_own_words_is_a_model(names: tuple[str, str]) -> None:
    # The swaps of test_a_pool_holds_one_device_and_swaps_its_members, whatever the names: a
    # sleep that makes room for "prime" is a swap, not a prime, and is not woken back.
    first, second = names
    result = simulate(
        "always-on",
        [(0, first), (100, second), (200, first), (300, second)],
        layout=pool_of(first, second, min_residency=0.0),
    )
    assert result.swaps == 3 and result.wakes == 3
    held = sorted(result.per_model[first].held) + sorted(result.per_model[second].held)
    assert held == pytest.approx(
        [SLEEP_AGAIN + WAKE_1, SLEEP_AGAIN + WAKE_1, SLEEP + WAKE_1], abs=1e-3
    )
