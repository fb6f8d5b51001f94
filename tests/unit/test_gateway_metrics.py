"""GatewayMetrics moves as the gateway's requests do: answers, holds, wakes and rejections."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from snooze import __version__
from snooze.gateway.metrics import REJECT_REASONS, GatewayMetrics

CHAT = {"namespace": "default", "model": "chat"}


class Clock:
    """A clock the test moves by hand, so that hold durations are exact."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_a_request_counts_by_code_and_observes_its_duration() -> None:
    metrics = GatewayMetrics()
    r = metrics.registry
    metrics.request_done("default", "chat", 200, 0.4)
    metrics.request_done("default", "chat", 200, 2.0)
    metrics.request_done("default", "chat", 504, 120.0)
    assert value(r, "snooze_gateway_requests_total", code="200", **CHAT) == 2
    assert value(r, "snooze_gateway_requests_total", code="504", **CHAT) == 1
    assert value(r, "snooze_gateway_request_duration_seconds_count", **CHAT) == 3
    assert value(r, "snooze_gateway_request_duration_seconds_sum", **CHAT) == 122.4
    assert value(r, "snooze_gateway_request_duration_seconds_bucket", le="0.5", **CHAT) == 1


def test_an_unknown_model_is_the_empty_label() -> None:
    metrics = GatewayMetrics()
    metrics.request_done(None, None, 404, 0.001)
    metrics.rejected("unknown_model")
    r = metrics.registry
    empty = {"namespace": "", "model": ""}
    assert value(r, "snooze_gateway_requests_total", code="404", **empty) == 1
    assert value(r, "snooze_gateway_rejected_requests_total", reason="unknown_model", **empty) == 1
    # No per-model series for "no model": the held gauge exists only for real models.
    assert value(r, "snooze_gateway_held_requests", **empty) is None


def test_held_requests_rise_and_fall_and_each_wait_is_observed() -> None:
    clock = Clock()
    metrics = GatewayMetrics(clock=clock)
    r = metrics.registry
    held = "snooze_gateway_held_requests"
    with metrics.held("default", "chat"):
        assert value(r, held, **CHAT) == 1
        clock.now += 1.5
        with metrics.held("default", "chat"):
            assert value(r, held, **CHAT) == 2
            clock.now += 0.5
        assert value(r, held, **CHAT) == 1
    assert value(r, held, **CHAT) == 0
    assert value(r, "snooze_gateway_hold_duration_seconds_count", **CHAT) == 2
    assert value(r, "snooze_gateway_hold_duration_seconds_sum", **CHAT) == 2.5
    assert value(r, "snooze_gateway_hold_duration_seconds_bucket", le="0.5", **CHAT) == 1
    assert value(r, "snooze_gateway_hold_duration_seconds_bucket", le="2.5", **CHAT) == 2


def test_a_hold_that_fails_still_leaves_and_is_observed() -> None:
    metrics = GatewayMetrics()
    r = metrics.registry
    with pytest.raises(TimeoutError), metrics.held("default", "chat"):
        raise TimeoutError
    assert value(r, "snooze_gateway_held_requests", **CHAT) == 0
    assert value(r, "snooze_gateway_hold_duration_seconds_count", **CHAT) == 1


def test_hold_buckets_span_ten_milliseconds_to_ten_minutes() -> None:
    metrics = GatewayMetrics()
    with metrics.held("default", "chat"):
        pass
    buckets = [
        float(sample.labels["le"])
        for family in metrics.registry.collect()
        if family.name == "snooze_gateway_hold_duration_seconds"
        for sample in family.samples
        if sample.name.endswith("_bucket") and sample.labels["le"] != "+Inf"
    ]
    assert min(buckets) == 0.01 and max(buckets) == 600


def test_wake_requests_count_per_model() -> None:
    metrics = GatewayMetrics()
    metrics.wake_requested("default", "chat")
    metrics.wake_requested("default", "chat")
    metrics.wake_requested("other", "chat")
    r = metrics.registry
    assert value(r, "snooze_gateway_wake_requests_total", **CHAT) == 2
    assert value(r, "snooze_gateway_wake_requests_total", namespace="other", model="chat") == 1


def test_rejection_series_exist_at_zero_before_the_first_rejection() -> None:
    """`increase()` cannot see a series' first sample, so a model's first timeout would be
    invisible to the alerts if its series were created by that timeout."""
    metrics = GatewayMetrics()
    r = metrics.registry
    rejected = "snooze_gateway_rejected_requests_total"
    for reason in ("unknown_model", "bad_request", "too_large"):
        assert value(r, rejected, namespace="", model="", reason=reason) == 0
    assert value(r, rejected, reason="timeout", **CHAT) is None
    with metrics.held("default", "chat"):
        assert value(r, rejected, reason="timeout", **CHAT) == 0
    metrics.rejected("timeout", namespace="default", model="chat")
    assert value(r, rejected, reason="timeout", **CHAT) == 1
    assert value(r, rejected, reason="limit", **CHAT) == 0


@pytest.mark.parametrize("reason", REJECT_REASONS)
def test_every_reason_of_the_closed_set_is_accepted(reason: str) -> None:
    metrics = GatewayMetrics()
    metrics.rejected(reason, namespace="default", model="chat")  # type: ignore[arg-type]
    assert value(metrics.registry, "snooze_gateway_rejected_requests_total", reason=reason, **CHAT)


def test_the_reason_set_is_closed_and_codes_are_http_codes() -> None:
    metrics = GatewayMetrics()
    with pytest.raises(ValueError, match="unknown rejection reason"):
        metrics.rejected("Connection reset by peer")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="HTTP status"):
        metrics.request_done("default", "chat", 0, 0.1)
    assert set(REJECT_REASONS) == {
        "timeout",
        "limit",
        "unknown_model",
        "bad_request",
        "too_large",
        "unavailable",
        "upstream_error",
        "upstream_timeout",
        "upstream_stalled",
        "client_stalled",
        "shutting_down",
    }


def test_build_info_and_own_registries() -> None:
    first, second = GatewayMetrics(), GatewayMetrics()
    first.wake_requested("default", "chat")
    assert value(first.registry, "snooze_gateway_build_info", version=__version__) == 1
    assert value(second.registry, "snooze_gateway_wake_requests_total", **CHAT) is None
