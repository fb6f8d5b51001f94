"""The operator reads the gateway's per-engine counters instead of probing engines whose
requests all come through it; an engine with traffic straight to it is still probed every
interval and never slept while it serves."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import httpx
from gateway_fixtures import GatewayThread, gateway, routable_pods
from waits import wait_for

from snooze.gateway import metrics_port
from snooze.gateway.metrics import GatewayMetrics
from snooze.sim import SimulatedEngine

from .conftest import FAST, Cluster, OperatorThread
from .test_gateway import MESSAGES, add_model

__all__ = ["gateway"]
CHAT = "/v1/chat/completions"
PROBE = "GET /metrics/"  # the path whose name[] filter works on every vLLM release


@contextmanager
def metrics_served(metrics: GatewayMetrics) -> Iterator[str]:
    """The gateway's metrics port, as `snooze gateway --metrics-port` serves it."""
    server, thread = metrics_port.serve(0, metrics.registry, metrics.idle, addr="127.0.0.1")
    try:
        yield f"http://127.0.0.1:{server.server_port}/metrics"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


class Traffic:
    """Requests one after the other to `url` from a thread, until stopped; counts the answers."""

    def __init__(self, url: str, model: str) -> None:
        self.url, self.model = url, model
        self.codes: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        body = {"model": self.model, "messages": MESSAGES, "max_tokens": 4}
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                self.codes.append(client.post(self.url, json=body).status_code)
                time.sleep(0.02)

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(30)


def probes(engine: SimulatedEngine) -> int:
    return engine.seen[PROBE]


def test_an_engine_fronted_by_the_gateway_is_probed_less_and_direct_traffic_still_counts(
    cluster: Cluster, gateway: GatewayThread
) -> None:
    with metrics_served(gateway.g.metrics) as url:
        operator = OperatorThread(replace(FAST, gateway_metrics=(url,))).start()
        try:
            spec = {"idle": {"after": "2s"}}
            (fronted,) = add_model(cluster, "fronted", spec=spec)
            (direct,) = add_model(cluster, "direct", spec=spec)
            for name in ("fronted", "direct"):
                wait_for(f"{name} routable", lambda n=name: routable_pods(gateway, n) == 1)

            before = probes(fronted), probes(direct)
            began = time.monotonic()
            with (
                Traffic(gateway.url + CHAT, "fronted") as through,
                Traffic(f"http://{direct.address}{CHAT}", "direct") as straight,
            ):
                # Twice idle.after: without traffic both would have been slept by now.
                wait_for("4 s of traffic", lambda: time.monotonic() - began >= 4, timeout=30)
            fronted_probes = probes(fronted) - before[0]
            direct_probes = probes(direct) - before[1]

            assert through.codes and set(through.codes) == {200}, through.codes
            assert straight.codes and set(straight.codes) == {200}, straight.codes
            # Neither was slept while it served: the gateway's counters kept one awake, the
            # probes the other.
            assert fronted.sleep_calls == 0 and direct.sleep_calls == 0
            # The fronted engine is probed at the drift interval (1 s here); the direct one at
            # every probe interval (0.1 s) while its traffic lasts.
            assert direct_probes > 2 * fronted_probes, (fronted_probes, direct_probes)

            # When the traffic stops, both fall asleep: the gateway's last request dates the
            # fronted one's idleness.
            for name in ("fronted", "direct"):
                wait_for(f"{name} asleep", lambda n=name: cluster.pod_state(f"{n}-0") == "asleep")
        finally:
            operator.stop()


def test_without_the_gateways_counters_every_engine_is_probed_while_it_serves(
    cluster: Cluster, operator: OperatorThread, gateway: GatewayThread
) -> None:
    # The same traffic through the gateway, but the operator cannot read its counters: only
    # probes can tell the engine is serving, so it is probed every interval.
    (fronted,) = add_model(cluster, "fronted", spec={"idle": {"after": "2s"}})
    wait_for("fronted routable", lambda: routable_pods(gateway, "fronted") == 1)
    before = probes(fronted)
    began = time.monotonic()
    with Traffic(gateway.url + CHAT, "fronted") as through:
        wait_for("4 s of traffic", lambda: time.monotonic() - began >= 4, timeout=30)
    assert set(through.codes) == {200} and fronted.sleep_calls == 0
    assert probes(fronted) - before >= 12, probes(fronted) - before
