"""The operator's metrics move with what it does: wakes, failures, states, time asleep."""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from waits import wait_for

from snooze.operator.metrics import OperatorMetrics

from .conftest import Cluster

LABELS = {"app": "chat"}


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def test_wake_and_sleep_are_observed(
    cluster: Cluster, operator_with_metrics: tuple[object, OperatorMetrics]
) -> None:
    _, metrics = operator_with_metrics
    r = metrics.registry
    engine = cluster.create_pod("chat-0", labels=LABELS)
    cluster.create_model("chat", {"selector": {"matchLabels": LABELS}, "idle": {"after": "1s"}})
    wait_for("asleep", lambda: cluster.pod_state("chat-0") == "asleep")
    ids = {"namespace": "default", "model": "chat"}
    wait_for(
        "a sleep observed",
        lambda: (
            value(r, "snooze_sleep_duration_seconds_count", level="1", namespace="default") == 1
        ),
    )
    wait_for(
        "state asleep published",
        lambda: value(r, "snooze_engine_state", pod="chat-0", state="asleep", **ids) == 1,
    )
    assert value(r, "snooze_engine_state", pod="chat-0", state="awake", **ids) == 0
    wait_for("time asleep counted", lambda: value(r, "snooze_asleep_seconds_total", **ids) > 0)
    # No series for what has not happened: no failure, and no wake yet.
    assert r.get_sample_value("snooze_wake_failures_total", {**ids, "reason": "Timeout"}) is None
    assert r.get_sample_value("snooze_wake_duration_seconds_count", {**ids, "level": "1"}) is None
    assert value(r, "snooze_models", phase="Asleep") == 1

    cluster.request_wake("chat")
    wait_for("awake", lambda: not engine.is_sleeping)
    wait_for(
        "one wake observed",
        lambda: value(r, "snooze_wake_duration_seconds_count", level="1", **ids) == 1,
    )
    assert value(r, "snooze_wake_duration_seconds_sum", level="1", **ids) > 0
    assert value(r, "snooze_operator_build_info", version=__import__("snooze").__version__) == 1


def test_hybrid_crash_counts_a_failure_with_its_reason(
    cluster: Cluster, operator_with_metrics: tuple[object, OperatorMetrics]
) -> None:
    _, metrics = operator_with_metrics
    r = metrics.registry
    cluster.create_pod("hybrid-0", labels=LABELS, hybrid_wake_crash=True)
    cluster.create_model(
        "chat",
        {
            "selector": {"matchLabels": LABELS},
            "idle": {"after": "1s"},
            "wake": {"onFailure": "Restart"},
        },
    )
    wait_for("asleep", lambda: cluster.pod_state("hybrid-0") == "asleep")
    cluster.request_wake("chat")
    ids = {"namespace": "default", "model": "chat"}
    wait_for(
        "a failure counted",
        lambda: value(r, "snooze_wake_failures_total", reason="HybridKVCacheReinit", **ids) == 1,
    )
    wait_for(
        "a restart counted",
        lambda: value(r, "snooze_pod_restarts_total", reason="HybridKVCacheReinit", **ids) == 1,
    )
    assert value(r, "snooze_wake_duration_seconds_count", level="1", **ids) == 0
    # The deleted pod's series are gone.
    wait_for(
        "series dropped",
        lambda: (
            r.get_sample_value("snooze_engine_state", {"pod": "hybrid-0", "state": "asleep", **ids})
            is None
        ),
    )
    # Deleted once: the loop does not act on a pod it deleted while its index still lists it.
    assert value(r, "snooze_pod_restarts_total", reason="HybridKVCacheReinit", **ids) == 1
