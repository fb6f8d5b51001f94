"""The demo's pure parts: the scenario's scaling and the summary's arithmetic."""

from __future__ import annotations

import pytest

from snooze.api.durations import parse_duration
from snooze.api.reasons import FailureReason
from snooze.demo import replayed, scenario, summary
from snooze.demo.picture import deletions
from snooze.demo.sampler import incidents_between, pod_state
from snooze.demo.timeline import Incident, PodSample, Sample, Timeline, with_failed
from snooze.demo.traffic import Record


def test_time_scale_shortens_latencies_and_timers() -> None:
    full = scenario.build(scale=1.0)
    quick = scenario.build(scale=0.25)
    for a, b in zip(full.models, quick.models, strict=True):
        timed = ("sleep_seconds", "level2_sleep_seconds", "wake_seconds", "reload_seconds")
        for key in (*timed, "startup_seconds"):
            assert b.engine[key] == pytest.approx(a.engine[key] / 4, abs=0.002), (a.name, key)
        if a.pool is not None:  # only the pool puts its members to sleep
            assert a.spec["idle"]["after"] == b.spec["idle"]["after"] == "Never"
            # The container starts later than the pool can make room for it, at every scale.
            for m, scale in ((a, 1.0), (b, 0.25)):
                probes = scenario.POOL_REACTION_PROBES * scenario.probe_interval(scale)
                reaction = m.engine["sleep_seconds"] + probes
                assert m.container_start_seconds >= reaction - 0.001  # rounded to ms
            assert b.container_start_seconds < a.container_start_seconds
        else:
            assert parse_duration(b.spec["idle"]["after"]) == pytest.approx(
                parse_duration(a.spec["idle"]["after"]) / 4
            )
        assert b.engine["gpu_memory_gib"] == a.engine["gpu_memory_gib"]  # sizes do not scale


def test_latencies_follow_the_published_figures() -> None:
    built = scenario.build()
    for m in built.models:
        assert 0.1 <= m.engine["wake_seconds"] <= 3.0, m.name  # level-1 wakes: 0.28 s to 3 s
    summarize = built.model("summarize")
    assert summarize.spec["sleep"]["level"] == 2
    assert summarize.engine["reload_seconds"] > 3 * summarize.engine["wake_seconds"]
    assert summarize.spec["scaleTargetRef"] == {"kind": "Deployment", "name": "summarize"}
    assert parse_duration(summarize.spec["scaleToZeroAfter"]) > parse_duration(
        summarize.spec["idle"]["after"]
    )
    assert built.model("hybrid-unpatched").engine["hybrid_wake_crash"] is True
    assert built.model("hybrid-patched").engine.get("hybrid_wake_crash") is None
    assert (
        scenario.build(hybrid_crash=False).model("hybrid-unpatched").engine["hybrid_wake_crash"]
        is False
    )


def test_duration_stretches_the_traffic_plan() -> None:
    full = scenario.build(duration=60)
    short = scenario.build(duration=20)
    assert len(full.traffic) == len(short.traffic)
    for a, b in zip(full.traffic, short.traffic, strict=True):
        assert b.at == pytest.approx(a.at / 3)
        assert b.model == a.model
    assert all(p.at < 20 for p in short.traffic)
    counts = {m: sum(1 for p in full.traffic if p.model == m) for m in full.model_names}
    assert counts["chat"] > 40 and counts["code"] == 24 and counts["summarize"] == 1
    assert any(p.stream for p in full.traffic) and not all(p.stream for p in full.traffic)
    assert scenario.build(seed=1).traffic != full.traffic
    assert scenario.build(seed=0).traffic == full.traffic


def test_bad_options_are_refused() -> None:
    with pytest.raises(ValueError):
        scenario.build(duration=0)
    with pytest.raises(ValueError):
        scenario.build(scale=-1)


def test_durations_in_the_spec_are_valid() -> None:
    assert scenario.seconds(2.4) == "2400ms"
    assert scenario.seconds(5) == "5s"
    assert parse_duration(scenario.seconds(0.0001)) == 0.001


def _timeline(states: list[dict[str, str]], step: float = 1.0) -> Timeline:
    timeline = Timeline()
    for i, pods in enumerate(states):
        timeline.add(
            Sample(
                t=i * step,
                pods={n: PodSample(model="m", state=s, gpu_bytes=0) for n, s in pods.items()},
                models={},
            )
        )
    return timeline


def test_asleep_share_counts_asleep_and_zero_replicas() -> None:
    # Two engines for 4 s: 1 asleep for 1 s, both asleep for 1 s, no pod for 1 s, awake 1 s.
    timeline = _timeline(
        [
            {"a": "awake", "b": "asleep"},
            {"a": "asleep", "b": "asleep"},
            {},
            {"c": "loading"},
            {"c": "awake"},
        ]
    )
    assert summary.asleep_share(timeline, "m", 2) == pytest.approx((1 + 2 + 2 + 0) / (2 * 4))
    assert summary.asleep_share(timeline, "other", 1) == 1.0  # never had a pod
    assert summary.asleep_share(Timeline(), "m", 2) == 0.0


def test_asleep_share_never_exceeds_one() -> None:
    timeline = _timeline([{"a": "asleep", "b": "asleep", "c": "asleep"}] * 3)
    assert summary.asleep_share(timeline, "m", 2) == 1.0


def test_percentiles() -> None:
    assert summary.percentile([], 50) is None
    assert summary.percentile([3.0], 99) == 3.0
    values = [float(v) for v in range(1, 101)]
    assert summary.percentile(values, 50) == 50.0
    assert summary.percentile(values, 99) == 99.0


def test_summary_rows_add_up() -> None:
    records = [
        Record(model="m", stream=False, planned=0, answered=1, status=200, held=0.5),
        Record(model="m", stream=True, planned=0, answered=2, status=200),
        Record(model="m", stream=False, planned=0, answered=3, status=504, error="timeout"),
        Record(model="m", stream=False, planned=0),
    ]
    timeline = _timeline([{"a": "asleep"}, {"a": "awake"}, {"a": "awake"}])
    timeline.wakes["m"] = [(1.0, 0.3), (2.0, 0.5)]
    [row] = summary.summarize(
        records=records,
        timeline=timeline,
        baselines={"m": 1},
        wakes={"m": 2},
        restarts={},
        expected_errors={},
    )
    assert (row.requests, row.errors, row.unanswered, row.wakes) == (4, 2, 1, 2)
    assert row.held_seconds == 0.5
    assert row.asleep_share == pytest.approx(0.5)
    assert (row.wake_p50, row.wake_p99) == (0.3, 0.5)
    text = "\n".join(summary.table([row]))
    assert "50%" in text and "wake p99" in text


def test_deletions_mark_where_a_pod_ended() -> None:
    spans = [(0.0, 1.0, "awake"), (1.0, 2.0, "absent"), (2.0, 3.0, "absent")]
    assert deletions(spans) == [1.0]
    assert deletions([(0.0, 1.0, "absent"), (1.0, 2.0, "awake")]) == []


def test_each_counter_increment_is_an_incident() -> None:
    wake = ("snooze_wake_failures_total", "m", FailureReason.HYBRID_KV_CACHE_REINIT)
    restart = ("snooze_pod_restarts_total", "m", FailureReason.HYBRID_KV_CACHE_REINIT)
    found = incidents_between({wake: 1.0}, {wake: 3.0, restart: 1.0}, t=5.0)
    assert [(i.what, i.reason, i.t) for i in found] == [
        ("wake failed", "HybridKVCacheReinit", 5.0),
        ("wake failed", "HybridKVCacheReinit", 5.0),
        ("pod restarted", "HybridKVCacheReinit", 5.0),
    ]
    assert incidents_between({wake: 3.0}, {wake: 3.0}, t=6.0) == []


def test_a_pod_is_loading_until_ready_then_its_label() -> None:
    # As the demo's ReplicaSet stand-in marks a pod once its engine has loaded.
    ready = {
        "status": {
            "phase": "Running",
            "podIP": "127.0.0.2",
            "conditions": [{"type": "Ready", "status": "True"}],
        }
    }
    assert pod_state({"metadata": {"labels": {"snooze.dev/state": "waking"}}, **ready}) == "waking"
    assert pod_state({"metadata": {}, **ready}) == "awake"
    assert pod_state({"metadata": {"labels": {"snooze.dev/state": "awake"}}}) == "loading"


def test_a_failed_wake_is_summarized_with_its_remedy_and_the_cure() -> None:
    timeline = _timeline(
        [{"a": "asleep"}, {"a": "waking"}, {"a": "failed"}, {"b": "loading"}, {"b": "awake"}]
    )
    timeline.incidents += [
        Incident(t=2.0, model="m", what="wake failed", reason=FailureReason.HYBRID_KV_CACHE_REINIT),
        Incident(
            t=2.0, model="m", what="pod restarted", reason=FailureReason.HYBRID_KV_CACHE_REINIT
        ),
    ]
    [row] = summary.summarize(
        records=[],
        timeline=timeline,
        baselines={"m": 1},
        wakes={"m": 0},
        restarts={"m": 1},
        expected_errors={},
    )
    assert (row.wake_failures, row.failure_reasons) == (1, ("HybridKVCacheReinit",))
    assert (row.first_failure, row.serving_again) == (2.0, 2.0)
    [line] = summary.failure_lines([row])
    assert line.startswith("m: 1 wake(s) failed (HybridKVCacheReinit) from 2.0s")
    assert "remedy: pod restarted 1x" in line and "serving again 2.0s" in line
    assert "images/vllm" in line
    assert line in summary.table([row])
    assert "failed" in timeline.states_seen("m")


def test_a_pod_restarted_before_it_was_sampled_failing_is_redrawn() -> None:
    sample = Sample(t=1.0, pods={"a": PodSample(model="m", state="waking", gpu_bytes=0)}, models={})
    assert with_failed(sample, {"a"}).pods["a"].state == "failed"
    assert with_failed(sample, set()) is sample


def test_the_closing_comparison_replays_both_sides() -> None:
    """The fixed TTL and the scenario as deployed, both replayed on the same requests: the
    pool's four members share one GPU, on GPUs of their own they never sleep."""
    sc = scenario.build(duration=60, scale=0.25)
    records = [Record(model=p.model, stream=p.stream, planned=p.at, sent=p.at) for p in sc.traffic]
    rows, ttl, deployed = replayed.compare(sc, records, end=60.0)
    by = {r.model: r for r in rows}
    assert set(by) == {p.model for p in sc.traffic}
    assert sum(r.requests for r in rows) == len(records) == ttl.requests == deployed.requests
    # chat's two engines and one each for the other ten models on their own; the pool's
    # four share one as deployed.
    assert (ttl.devices_always_on, deployed.devices_always_on) == (11, 8)
    for model in scenario.POOL_MEMBERS:
        assert by[model].policy == "always-on" and by[model].ttl_held == 0
        assert by[model].deployed_held > 0  # each phase swaps two members in
        assert by[model].deployed_gpu_hours < by[model].ttl_gpu_hours
    # summarize goes to zero replicas as deployed: its GPU is given back for a while.
    assert deployed.device_hours < ttl.device_hours - 3 * 60 / 3600
    assert ttl.device_hours == pytest.approx(ttl.devices_always_on * 60 / 3600, rel=0.01)
    text = "\n".join(replayed.lines(rows, ttl, deployed))
    assert "both replayed through snooze whatif's engine" in text
    assert "GPUs held all along: 11 with a fixed TTL, 8 as deployed" in text


def test_a_pod_whose_wake_failed_between_two_samples_is_still_drawn_failed() -> None:
    """The wake crashed and the pod was deleted between two samples: the last sample shows it
    asleep (its waking too brief to be seen), and is redrawn failed all the same."""
    from typing import Any

    from snooze.demo.sampler import Sampler
    from snooze.operator.metrics import OperatorMetrics

    none: Any = None
    sampler = Sampler(
        api=none, controller=none, gateway=none, metrics=OperatorMetrics(), models=["m"]
    )
    asleep = PodSample(model="m", state="asleep", gpu_bytes=0)
    other = PodSample(model="n", state="asleep", gpu_bytes=0)
    sampler.timeline.samples.append(Sample(t=1.0, pods={"m-1": asleep, "n-1": other}, models={}))
    assert sampler._failing_pods("m", {}) == set()  # gone from the current sample
    redrawn = sampler.timeline.samples[-1].pods
    assert redrawn["m-1"].state == "failed" and redrawn["n-1"].state == "asleep"
