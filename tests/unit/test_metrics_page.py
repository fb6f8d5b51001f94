"""The operator's metrics page stays small at a thousand models: one series per engine for its
state, and a model's other series only once something happened to it."""

from __future__ import annotations

from prometheus_client import generate_latest

from snooze.operator.metrics import OperatorMetrics

MODELS = 1000
LIMIT = 500_000  # bytes, at 2,000 engines


def pods(model: str, state: str) -> dict[str, str | None]:
    return {f"{model}-{i}": state for i in range(2)}


def test_a_thousand_models_of_two_engines_fit_in_half_a_megabyte() -> None:
    metrics = OperatorMetrics()
    names = [f"model-{i:04d}" for i in range(MODELS)]
    for name in names:
        metrics.set_engine_states("default", name, pods(name, "awake"))
        metrics.set_phase("default", name, "Awake")
    steady = generate_latest(metrics.registry)
    assert len(steady) < LIMIT
    assert steady.count(b"snooze_engine_state{") == 2 * MODELS  # one per engine, not per state
    # The whole fleet sleeps once: states move, sleeps are timed per namespace, and each
    # model counts its time asleep.
    for name in names:
        metrics.set_engine_states("default", name, pods(name, "asleep"))
        for _ in range(2):
            metrics.sleep_duration.labels("default", "1").observe(5.7)
        metrics.asleep_seconds.labels("default", name).inc(60)
    after = generate_latest(metrics.registry)
    assert len(after) < LIMIT, len(after)
    assert after.count(b"snooze_engine_state{") == 2 * MODELS
    assert b'state="awake"' not in after


def test_a_model_has_no_series_of_failures_or_wakes_before_it_has_any() -> None:
    metrics = OperatorMetrics()
    metrics.set_engine_states("default", "chat", pods("chat", "awake"))
    page = generate_latest(metrics.registry).decode()
    assert "snooze_wake_failures_total{" not in page
    assert "snooze_wake_duration_seconds_bucket{" not in page
    metrics.observe_wake("default", "chat", "1", 0.3)
    page = generate_latest(metrics.registry).decode()
    assert (
        'snooze_wake_duration_seconds_count{level="1",model="chat",namespace="default"} 1.0' in page
    )
