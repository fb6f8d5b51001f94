"""A real Prometheus scrapes the operator and the gateway while models sleep, wake and fail:
every dashboard query then returns data and every alert rule evaluates without error.

The operator and the gateway are the real ones (kopf and Snooze's handlers, and the gateway's
server, against the sandbox), and the traffic is real requests through the gateway.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIServer

import httpx
import pytest
import yaml
from gateway_fixtures import GatewayThread, routable_pods
from ports import free_port
from prometheus_client import CollectorRegistry, start_http_server
from waits import wait_for

from snooze.operator.metrics import OperatorMetrics
from snooze.sim.sglang.engine import SGLangConfig

from .conftest import Cluster, OperatorThread, next_address
from .test_pools import Kubelet

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "charts" / "snooze" / "dashboards" / "snooze.json"
RULES = ROOT / "charts" / "snooze" / "rules" / "snooze.rules.yaml"
PROMETHEUS = shutil.which("prometheus")
GPUPOOLS = "/apis/snooze.dev/v1alpha1/namespaces/default/gpupools"
pytestmark = pytest.mark.needs("prometheus")
NS = "default"
# Jobs named as the chart's ServiceMonitor names them (after the metrics Services of a release
# called "snooze"), so that the Down alerts' job matchers are tried on realistic names.
OPERATOR_JOB = "snooze-operator-metrics"
GATEWAY_JOB = "snooze-gateway-metrics"


@contextmanager
def serving(registry: CollectorRegistry) -> Iterator[int]:
    """A registry's /metrics on a free loopback port, shut down afterwards."""
    server: WSGIServer
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        yield int(server.server_port)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


class Prometheus:
    """A real Prometheus server in a subprocess, and the bits of its HTTP API the test reads."""

    def __init__(self, tmp_path: Path, targets: dict[str, int]) -> None:
        config = {
            # Scrapes and rule evaluations every second, so that a few seconds make a history.
            "global": {
                "scrape_interval": "1s",
                "scrape_timeout": "1s",
                "evaluation_interval": "1s",
            },
            "rule_files": [str(RULES)],
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}
                for job, port in targets.items()
            ],
        }
        config_file = tmp_path / "prometheus.yml"
        config_file.write_text(yaml.safe_dump(config))
        self.port = free_port()
        self.log = tmp_path / "prometheus.log"
        assert PROMETHEUS is not None
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [
                    PROMETHEUS,
                    f"--config.file={config_file}",
                    f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=5)

    def ready(self) -> bool:
        assert self.process.poll() is None, f"prometheus exited: {self.log.read_text()[-2000:]}"
        try:
            return self.http.get("/-/ready").status_code == 200
        except httpx.TransportError:
            return False

    def api(self, path: str, **params: str) -> Any:
        response = self.http.get(f"/api/v1/{path}", params=params)
        body = response.json()
        assert body["status"] == "success", f"{path} {params}: {body}"
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", data
        result: list[dict[str, Any]] = data["result"]
        return result

    def value(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def rules(self) -> list[dict[str, Any]]:
        return [rule for group in self.api("rules")["groups"] for rule in group["rules"]]

    def stop(self) -> None:
        self.http.close()
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)


@pytest.fixture
def prometheus(
    tmp_path: Path,
    operator_with_metrics: tuple[OperatorThread, OperatorMetrics],
    gateway: GatewayThread,
) -> Iterator[Prometheus]:
    _, operator_metrics = operator_with_metrics
    with (
        serving(operator_metrics.registry) as op_port,
        serving(gateway.g.metrics.registry) as gw_port,
    ):
        server = Prometheus(tmp_path, {OPERATOR_JOB: op_port, GATEWAY_JOB: gw_port})
        try:
            wait_for("prometheus ready", server.ready, timeout=20)
            yield server
        finally:
            server.stop()


def scraped(prom: Prometheus, expr: str, check: Callable[[float], bool] = bool) -> None:
    """Wait until Prometheus itself has a sample of `expr` that passes `check`."""

    def seen() -> bool:
        value = prom.value(expr)
        return value is not None and check(value)

    wait_for(f"Prometheus to scrape {expr}", seen, timeout=10)


def panel_targets() -> list[tuple[str, str]]:
    board = json.loads(DASHBOARD.read_text())

    def panels(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
        for panel in node.get("panels", []):
            yield panel
            yield from panels(panel)

    return [
        (panel["title"], target["expr"])
        for panel in panels(board)
        for target in panel.get("targets", [])
    ]


def grafana(expr: str) -> str:
    """The query as Grafana sends it with both models picked (a multi-value regex) and the pool."""
    for name, value in [
        ("$__rate_interval", "1m"),
        ("$__range", "5m"),
        ("$namespace", NS),
        ("$model", "(chat|hybrid)"),
        ("$pool", "gpu-p"),
    ]:
        expr = expr.replace(name, value)
    return expr


def test_dashboard_queries_return_data_and_rules_evaluate(
    cluster: Cluster,
    operator_with_metrics: tuple[OperatorThread, OperatorMetrics],
    gateway: GatewayThread,
    prometheus: Prometheus,
) -> None:
    prom = prometheus
    http = httpx.Client(base_url=gateway.url, timeout=30)
    pool = ThreadPoolExecutor(4)

    def ask(model: str) -> int:
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        return http.post("/v1/chat/completions", json=body).status_code

    # chat wakes slowly enough for a scrape to see its request held.
    chat = cluster.create_pod("chat-0", labels={"app": "chat"}, model="chat", wake_seconds=2.5)
    cluster.create_pod("hybrid-0", labels={"app": "hybrid"}, model="hybrid", hybrid_wake_crash=True)
    # An SGLang server too, so that the panels split by engine kind have both kinds.
    sglang = SGLangConfig(
        model="sg",
        host=next_address(),
        port=8000,
        reload_seconds=0.1,
        checksum_seconds_per_gib=0.001,
    )
    cluster.create_pod("sg-0", labels={"app": "sg"}, engine=sglang)
    for name, wake in (("chat", {}), ("hybrid", {"timeout": "2s", "onFailure": "Restart"})):
        cluster.create_model(
            name,
            {"selector": {"matchLabels": {"app": name}}, "idle": {"after": "2s"}, "wake": wake},
        )
    cluster.create_model(
        "sg",
        {
            "selector": {"matchLabels": {"app": "sg"}},
            "engine": {"kind": "sglang"},
            "idle": {"after": "2s"},
        },
    )
    wait_for("the gateway knows all", lambda: len(http.get("/v1/models").json()["data"]) == 3)
    for name in ("chat", "hybrid", "sg"):
        wait_for(f"{name} routable", lambda name=name: routable_pods(gateway, name) == 1)
    # Traffic before the sleeps, so that the gateway's series exist in Prometheus before they
    # move (rate() and increase() need two samples).
    assert ask("chat") == 200
    assert ask("hybrid") == 200
    assert ask("nobody") == 404
    scraped(prom, f'snooze_gateway_requests_total{{namespace="{NS}",model="chat",code="200"}}')
    scraped(
        prom,
        'snooze_gateway_rejected_requests_total{model="hybrid",reason="timeout"}',
        lambda v: True,
    )
    wait_for("chat asleep", lambda: cluster.pod_state("chat-0") == "asleep")
    scraped(prom, 'snooze_engine_state{model="chat",state="asleep"}')

    # A request to the sleeping model is held while it wakes: held requests rise, then fall.
    held = pool.submit(ask, "chat")
    scraped(
        prom, f'snooze_gateway_held_requests{{namespace="{NS}",model="chat"}}', lambda v: v == 1
    )
    assert held.result(30) == 200 and not chat.is_sleeping
    scraped(prom, 'snooze_gateway_held_requests{model="chat"}', lambda v: v == 0)
    scraped(prom, 'snooze_wake_duration_seconds_count{model="chat"}', lambda v: v == 1)
    scraped(prom, 'snooze_gateway_wake_requests_total{model="chat"}', lambda v: v == 1)

    # A second sleep and wake: the wake histogram then moves between two scrapes.
    wait_for("chat asleep again", lambda: cluster.pod_state("chat-0") == "asleep")
    assert ask("chat") == 200
    scraped(prom, 'snooze_wake_duration_seconds_count{model="chat"}', lambda v: v == 2)
    # The SGLang server, released and resumed for a request, twice.
    for times in (1, 2):
        wait_for("sg asleep", lambda: cluster.pod_state("sg-0") == "asleep")
        assert ask("sg") == 200
        scraped(prom, 'snooze_wake_duration_seconds_count{model="sg"}', lambda v, n=times: v == n)
    scraped(prom, 'snooze_model_engine_info{model="sg",engine="sglang"}')

    # The hybrid model's wake crashes; the operator deletes the pod (wake.onFailure: Restart)
    # and no controller recreates it here: the request held for it times out (504).
    wait_for("hybrid asleep", lambda: cluster.pod_state("hybrid-0") == "asleep")
    assert ask("hybrid") == 504
    scraped(prom, 'snooze_wake_failures_total{model="hybrid",reason="HybridKVCacheReinit"}')
    scraped(prom, 'snooze_gateway_rejected_requests_total{model="hybrid",reason="timeout"}')

    # A GPU pool of 40 GiB for two members of 30 GiB: the second one's start puts the first to
    # sleep, and a request for the first is held while the second sleeps for it (a wake's
    # eviction), then answered.
    shared = swap_on_a_pool(cluster, prom, ask)
    http.close()
    pool.shutdown()

    # Every panel's every query returns data.
    targets = panel_targets()
    assert len(targets) >= 15
    for title, expr in targets:
        query = grafana(expr)
        wait_for(f"data for {title!r}: {query}", partial(prom.query, query))
    for expr in [
        "histogram_quantile(0.99, sum by (le) ("
        'rate(snooze_wake_duration_seconds_bucket{model="chat"}[1m])))',
        "histogram_quantile(0.5, sum by (le) ("
        "rate(snooze_gateway_hold_duration_seconds_bucket[1m])))",
        f'sum(increase(snooze_asleep_seconds_total{{namespace="{NS}"}}[5m]))',
        "histogram_quantile(0.99, sum by (le) (rate(snooze_wake_duration_seconds_bucket[1m])"
        ' * on(namespace, model) group_left(engine) snooze_model_engine_info{engine="sglang"}))',
        "histogram_quantile(0.99, sum by (le) (rate(snooze_pool_wait_seconds_bucket[1m])))",
    ]:
        # Not just series: these figures are real (a quantile of nothing would be NaN).
        value = prom.value(expr)
        assert value is not None and 0 < value < 600, f"{expr}: {value}"

    # Every rule has been evaluated without error, and the right ones are active.
    def evaluated() -> list[dict[str, Any]] | None:
        rules = prom.rules()
        return rules if all(rule["health"] != "unknown" for rule in rules) else None

    rules = wait_for("every rule evaluated", evaluated)
    assert {rule["name"] for rule in rules} == {
        rule["alert"]
        for group in yaml.safe_load(RULES.read_text())["groups"]
        for rule in group["rules"]
    }
    for rule in rules:
        assert rule["health"] == "ok", f"{rule['name']}: {rule.get('lastError')}"

    def active() -> dict[str, set[str]]:
        found: dict[str, set[str]] = {}
        for rule in prom.rules():
            for alert in rule.get("alerts", []):
                found.setdefault(rule["name"], set()).add(alert["labels"].get("model", ""))
        return found

    wait_for(
        "the failure and the timeout alerts for the hybrid model",
        lambda: {"SnoozeWakeFailures", "SnoozeHeldRequestsTimingOut"} <= set(active()),
    )
    alerts = active()
    assert alerts["SnoozeWakeFailures"] == {"hybrid"}
    assert alerts["SnoozeHeldRequestsTimingOut"] == {"hybrid"}
    # Both processes are up under chart-style job names: the Down alerts stay quiet.
    assert "SnoozeOperatorDown" not in alerts and "SnoozeGatewayDown" not in alerts
    # The pool fits and no wake ran out of memory (the device's own count agrees).
    assert "SnoozePoolWakesOutOfMemory" not in alerts and "SnoozePoolOvercommitted" not in alerts
    assert sum(e.memory.oom_total["wake"] for e in shared.engines.values()) == 0


def swap_on_a_pool(cluster: Cluster, prom: Prometheus, ask: Callable[[str], int]) -> Kubelet:
    """Two members that cannot both be awake on one pool, swapped by a held request; the pool's
    series in Prometheus say so: memory by state, awake members, evictions of both reasons."""
    device = cluster.sim.add_device(name="gpu-p", memory_gib=40)
    body = {"metadata": {"name": "gpu-p"}, "spec": {"memory": "40Gi", "minResidency": "1s"}}
    cluster.http.post(GPUPOOLS, json=body).raise_for_status()
    for name in ("pa", "pb"):
        cluster.create_model(
            name,
            {
                "selector": {"matchLabels": {"app": name}},
                "idle": {"after": "Never"},
                "pool": {"name": "gpu-p", "memory": "30Gi", "asleepMemory": "1Gi"},
                "wake": {"timeout": "30s"},
            },
        )
    kubelet = Kubelet(cluster, device)
    kubelet.start("pa")
    scraped(prom, 'snooze_pool_awake_members{pool="gpu-p"}', lambda v: v == 1)
    kubelet.start("pb")  # loads once the pool has put pa to sleep for it
    scraped(prom, 'snooze_pool_evictions_total{pool="gpu-p",reason="start"}', lambda v: v == 1)
    wait_for("pa asleep", lambda: kubelet.engines["pa"].is_sleeping)
    assert ask("pa") == 200  # held while pb sleeps for it
    assert kubelet.engines["pb"].is_sleeping and not kubelet.engines["pa"].is_sleeping
    scraped(prom, 'snooze_pool_evictions_total{pool="gpu-p",reason="wake"}', lambda v: v == 1)
    scraped(prom, 'snooze_pool_wait_seconds_count{pool="gpu-p"}', lambda v: v >= 1)
    # One awake (30 GiB) and one asleep (1 GiB) of 40: what the device itself says.
    gib = 2**30
    memory = 'snooze_pool_memory_bytes{pool="gpu-p",state="%s"}'
    scraped(prom, memory % "awake", lambda v: v == 30 * gib)
    scraped(prom, memory % "asleep", lambda v: v == 1 * gib)
    scraped(prom, memory % "free", lambda v: v == 9 * gib <= device.free_bytes)
    scraped(prom, 'snooze_pool_awake_members{pool="gpu-p"}', lambda v: v == 1)
    scraped(prom, 'snooze_pool_waiting_wakes{pool="gpu-p"}', lambda v: v == 0)
    scraped(prom, 'snooze_pool_overcommitted{pool="gpu-p"}', lambda v: v == 0)
    return kubelet
