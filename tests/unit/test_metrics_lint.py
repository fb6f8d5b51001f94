"""Both processes' metrics pass `promtool check metrics` (Prometheus' naming and unit lint)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from snooze.gateway.metrics import GatewayMetrics
from snooze.operator.metrics import OperatorMetrics

PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.needs("promtool")


def operator_registry() -> CollectorRegistry:
    """Every operator metric with at least one series, so that each is linted."""
    metrics = OperatorMetrics()
    ids = ("default", "chat")
    metrics.wake_duration.labels(*ids, "1").observe(0.3)
    metrics.sleep_duration.labels("default", "1").observe(1.2)
    metrics.wake_failures.labels(*ids, "HybridKVCacheReinit").inc()
    metrics.sleep_failures.labels(*ids, "Timeout").inc()
    metrics.restarts.labels(*ids, "HybridKVCacheReinit").inc()
    metrics.asleep_seconds.labels(*ids).inc(12.5)
    metrics.tier_transitions.labels(*ids, "Asleep").inc()
    metrics.reconcile_errors.labels(*ids).inc()
    metrics.probe_failures.labels(*ids, "AnswerTooLarge").inc()
    metrics.gateway_scrape_failures.labels("InvalidAnswer").inc()
    metrics.set_engine_states(*ids, {"chat-0": "asleep", "chat-1": "awake"})
    metrics.set_phase(*ids, "Asleep")
    return metrics.registry


def gateway_registry() -> CollectorRegistry:
    metrics = GatewayMetrics()
    metrics.request_done("default", "chat", 200, 0.4)
    metrics.request_done(None, None, 404, 0.001)
    with metrics.held("default", "chat"):
        pass
    metrics.wake_requested("default", "chat")
    metrics.rejected("timeout", namespace="default", model="chat")
    metrics.rejected("bad_request")
    return metrics.registry


def promtool_check(exposition: bytes) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, "check", "metrics"],
        input=exposition.decode(),
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.mark.parametrize(
    ("name", "registry"),
    [("operator", operator_registry), ("gateway", gateway_registry)],
)
def test_exposition_passes_promtool_check_metrics(
    name: str, registry: Callable[[], CollectorRegistry]
) -> None:
    exposition = generate_latest(registry())
    result = promtool_check(exposition)
    assert result.returncode == 0, f"{name}: {result.stdout}{result.stderr}"
    assert not result.stdout.strip(), f"{name}: promtool's lint: {result.stdout}"


def test_promtool_does_find_problems() -> None:
    """The check above can fail: a counter without `_total` is caught."""
    bad = b"# HELP wakes Wakes.\n# TYPE wakes counter\nwakes 1\n"
    result = promtool_check(bad)
    assert result.returncode != 0 and "_total" in result.stdout + result.stderr


def test_every_metric_is_prefixed_and_documented() -> None:
    for registry in (operator_registry(), gateway_registry()):
        for family in registry.collect():
            assert family.name.startswith("snooze_"), family.name
            assert family.documentation.strip().endswith("."), family.name


def test_one_state_series_per_engine() -> None:
    # At thousands of engines a series per possible state made the page megabytes of zeros.
    metrics = OperatorMetrics()
    ids = ("default", "chat")
    metrics.set_engine_states(*ids, {"chat-0": "awake", "chat-1": "asleep"})
    metrics.set_engine_states(*ids, {"chat-0": "draining", "chat-1": "asleep"})
    samples = [
        s.labels
        for f in metrics.registry.collect()
        if f.name == "snooze_engine_state"
        for s in f.samples
    ]
    assert sorted((s["pod"], s["state"]) for s in samples) == [
        ("chat-0", "draining"),
        ("chat-1", "asleep"),
    ]
    metrics.set_engine_states(*ids, {"chat-1": "asleep"})  # chat-0 gone
    samples = [
        s.labels
        for f in metrics.registry.collect()
        if f.name == "snooze_engine_state"
        for s in f.samples
    ]
    assert [(s["pod"], s["state"]) for s in samples] == [("chat-1", "asleep")]
