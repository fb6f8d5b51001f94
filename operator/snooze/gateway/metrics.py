"""The gateway's Prometheus metrics, all in one place: names, units, labels and buckets.

Labels stay bounded: the InferenceModel's namespace and name (the operator's `namespace` and
`model` labels, so that dashboards join the two; "" when no model matched), an HTTP status
code, and a rejection reason from a closed set; never a request id or an error message.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Literal, get_args

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    disable_created_metrics,
)

from snooze import __version__
from snooze.api.agreed import (
    HELD_REQUESTS,
    POD_IN_FLIGHT,
    POD_LAST_REQUEST,
    POD_REQUESTS,
    POD_STALLS,
    PODS_WENT_IDLE,
)
from snooze.gateway.metrics_port import IdleSignal

# `_created` samples double every counter's and histogram's series and no panel or rule
# reads them: at a thousand models the page is megabytes, scraped every few seconds.
disable_created_metrics()  # type: ignore[no-untyped-call]

RejectReason = Literal[
    "timeout",  # held past the model's wake timeout: 504
    "limit",  # too many requests already held for the model: 429
    "unknown_model",  # no InferenceModel serves the requested name: 404
    "bad_request",  # not JSON, not an object, no `model`: 400
    "too_large",  # body over the gateway's limit: 413
    "unavailable",  # the model cannot be woken (wake.onRequest false, no wake possible): 503
    "upstream_error",  # no awake pod could be reached, or it failed while answering: 502
    "upstream_timeout",  # the engine sent nothing for longer than an --upstream-* bound: 504
    "upstream_stalled",  # the engine started no answer for --upstream-start-timeout: 502
    "client_stalled",  # the client took none of its answer for --client-read-timeout: cut
    "shutting_down",  # this replica is draining (SIGTERM): 503, another replica answers
]
REJECT_REASONS: tuple[RejectReason, ...] = get_args(RejectReason)
# Reasons that name a model; their series are created at zero when a model is first seen, so
# that the first timeout of a model is an increase that `increase()` and the alerts can see.
_MODEL_REASONS: tuple[RejectReason, ...] = (
    "timeout",
    "limit",
    "unavailable",
    "upstream_error",
    "upstream_timeout",
    "upstream_stalled",
    "client_stalled",
)

# A proxied completion: from a cached answer (tens of ms) to a long stream held for a wake.
REQUEST_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
# A hold: from a model that woke at once (10 ms) to a cold start's 10 min timeout.
HOLD_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600.0)


class Sending:
    """One request on its way to an engine (see GatewayMetrics.sending)."""

    sent = True

    def not_sent(self) -> None:
        """It never reached the engine (the connection failed): not counted as served."""
        self.sent = False


class GatewayMetrics:
    """Every metric the gateway exports, on a registry of its own.

    `model` is the InferenceModel's `metadata.name` (not the `modelName` clients send), the
    same value as the operator's `model` label; None or "" stands for "no model matched".
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = registry or CollectorRegistry()
        self._clock = clock
        self._seen: set[tuple[str, str]] = set()
        r = self.registry
        self.requests = Counter(
            "snooze_gateway_requests",
            "Requests answered, by model and HTTP status code (the gateway's own errors too).",
            ["namespace", "model", "code"],
            registry=r,
        )
        self.request_duration = Histogram(
            "snooze_gateway_request_duration_seconds",
            "Time from a request's arrival to its last byte sent, holds included.",
            ["namespace", "model"],
            buckets=REQUEST_BUCKETS,
            registry=r,
        )
        self.held_requests = Gauge(
            HELD_REQUESTS,
            "Requests waiting now for their model to wake.",
            ["namespace", "model"],
            registry=r,
        )
        self.hold_duration = Histogram(
            "snooze_gateway_hold_duration_seconds",
            "How long requests waited for a wake, whatever the outcome (timeouts included).",
            ["namespace", "model"],
            buckets=HOLD_BUCKETS,
            registry=r,
        )
        self.wake_requests = Counter(
            "snooze_gateway_wake_requests",
            "Wake requests the gateway sent to the operator (the model's annotation written).",
            ["namespace", "model"],
            registry=r,
        )
        self.rejected_requests = Counter(
            "snooze_gateway_rejected_requests",
            "Requests the gateway answered itself with an error, by reason: "
            + ", ".join(REJECT_REASONS)
            + ".",
            ["namespace", "model", "reason"],
            registry=r,
        )
        # Per pod, for the operator (operator/traffic/gateways.py): which engines served requests
        # and when, so that it need not probe an engine whose traffic all comes through here.
        self.pod_requests = Counter(
            POD_REQUESTS,
            "Requests sent to each engine (pod) and answered, or failed after being sent.",
            ["namespace", "pod"],
            registry=r,
        )
        # Before the in-flight gauge, so that a page is collected in that order: a page that
        # counts an engine gone idle also shows it with nothing in flight
        # (operator/traffic/gateways.py waits on /idle for a count other than the page's).
        self.went_idle = Counter(
            PODS_WENT_IDLE,
            "Times an engine's (pod's) last request in flight through this replica ended.",
            registry=r,
        )
        self.idle = IdleSignal()
        self._flying: dict[tuple[str, str], int] = {}
        # (What the in-flight gauge holds, kept here too: a gauge's value is not public API.)
        self.pod_in_flight = Gauge(
            POD_IN_FLIGHT,
            "Requests being sent to, or answered by, each engine (pod) now.",
            ["namespace", "pod"],
            registry=r,
        )
        self.pod_last_request = Gauge(
            POD_LAST_REQUEST,
            "When the last request to each engine (pod) ended, in seconds since the epoch.",
            ["namespace", "pod"],
            registry=r,
        )
        self.pod_stalls = Counter(
            POD_STALLS,
            "Times an engine (pod) started no answer for --upstream-start-timeout while requests "
            "waited on it: they got 502, and it got no request for a while.",
            ["namespace", "pod"],
            registry=r,
        )
        self.build_info = Info("snooze_gateway_build", "The gateway's version.", registry=r)
        self.build_info.info({"version": __version__})
        # Rejections without a model exist from the start, so `rate()` has a zero to start from.
        for reason in REJECT_REASONS:
            if reason not in _MODEL_REASONS:
                self.rejected_requests.labels("", "", reason)

    def _labels(self, namespace: str | None, model: str | None) -> tuple[str, str]:
        """The label values of a model, created at zero the first time it is seen."""
        key = (namespace or "", model or "")
        if key not in self._seen and key[1]:
            self._seen.add(key)
            self.held_requests.labels(*key)
            self.hold_duration.labels(*key)
            self.wake_requests.labels(*key)
            self.request_duration.labels(*key)
            for reason in _MODEL_REASONS:
                self.rejected_requests.labels(*key, reason)
        return key

    def request_done(
        self, namespace: str | None, model: str | None, code: int, seconds: float
    ) -> None:
        """One request answered with status `code` after `seconds` (call it for every answer)."""
        if not 100 <= code <= 599:
            raise ValueError(f"not an HTTP status code: {code}")
        key = self._labels(namespace, model)
        self.requests.labels(*key, str(code)).inc()
        self.request_duration.labels(*key).observe(seconds)

    @contextmanager
    def held(self, namespace: str, model: str) -> Iterator[None]:
        """Count a request as held while inside; its wait is observed on leaving, however."""
        key = self._labels(namespace, model)
        gauge = self.held_requests.labels(*key)
        began = self._clock()
        gauge.inc()
        try:
            yield
        finally:
            gauge.dec()
            self.hold_duration.labels(*key).observe(max(0.0, self._clock() - began))

    def wake_requested(self, namespace: str, model: str) -> None:
        """The gateway asked the operator to wake a model."""
        self.wake_requests.labels(*self._labels(namespace, model)).inc()

    @contextmanager
    def sending(
        self, namespace: str, pod: str, *, wall: Callable[[], float] = time.time
    ) -> Iterator[Sending]:
        """A request being sent to an engine and answered: in flight while inside, then done,
        with its end time (also when it failed once sent; not if it could not be sent:
        `Sending.not_sent()`)."""
        key = (namespace, pod)
        flight = self.pod_in_flight.labels(namespace, pod)
        flight.inc()
        self._flying[key] = self._flying.get(key, 0) + 1
        sending = Sending()
        try:
            yield sending
        finally:
            flight.dec()
            if sending.sent:
                self.pod_requests.labels(namespace, pod).inc()
                self.pod_last_request.labels(namespace, pod).set(wall())
            self._flying[key] -= 1
            if not self._flying[key]:
                del self._flying[key]
                self.went_idle.inc()
                self.idle.went_idle()

    def engine_stalled(self, namespace: str, pod: str) -> None:
        """An engine was found stuck (bounds/stalls.py)."""
        self.pod_stalls.labels(namespace, pod).inc()

    def pod_gone(self, namespace: str, pod: str) -> None:
        """Drop a deleted pod's series: the page keeps only pods that exist."""
        for metric in (
            self.pod_requests,
            self.pod_in_flight,
            self.pod_last_request,
            self.pod_stalls,
        ):
            with contextlib.suppress(KeyError):
                metric.remove(namespace, pod)

    def rejected(
        self, reason: RejectReason, *, namespace: str | None = None, model: str | None = None
    ) -> None:
        """The gateway refused a request itself; `reason` is one of REJECT_REASONS."""
        if reason not in REJECT_REASONS:
            raise ValueError(f"unknown rejection reason {reason!r}; one of {REJECT_REASONS}")
        self.rejected_requests.labels(*self._labels(namespace, model), reason).inc()
