"""The ServiceMonitor keeps the models' `namespace` and `pod` labels: a real Prometheus scrapes the
operator's and the gateway's metrics under the scrape configuration prometheus-operator makes of
the rendered ServiceMonitor, and the series keep the model's namespace and pod, not the scraped
pod's (which they would lose without honorLabels, as the same run shows)."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from ports import free_port
from prometheus_client import CollectorRegistry, start_http_server
from rendering import NAMESPACE, VALUE_SETS, render

from snooze.gateway.metrics import GatewayMetrics
from snooze.operator.metrics import OperatorMetrics

RULES = Path(__file__).resolve().parents[2] / "charts" / "snooze" / "rules" / "snooze.rules.yaml"
# The model whose metrics the operator and the gateway export, in a namespace of its own.
MODEL_NAMESPACE, MODEL, MODEL_POD = "team-a", "qwen3-8b", "qwen3-8b-7d9f-x2kq"


def test_every_endpoint_honors_labels() -> None:
    monitor = render(VALUE_SETS["everything"]).one("ServiceMonitor")
    assert monitor["spec"]["endpoints"]
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["honorLabels"] is True


def sanitized(name: str) -> str:
    """A Kubernetes label name as service discovery turns it into a Prometheus label name."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def scrape_config(
    monitor: dict[str, Any], index: int, *, job_suffix: str = "", honor_labels: bool | None = None
) -> dict[str, Any]:
    """The scrape configuration prometheus-operator generates for one endpoint of a
    ServiceMonitor (its `serviceMonitor/NAMESPACE/NAME/INDEX` job, as in its golden test
    files), less the Kubernetes service discovery and the sharding, and scraping every second."""
    endpoint = monitor["spec"]["endpoints"][index]
    keep_service = [
        {
            "action": "keep",
            "source_labels": [
                f"__meta_kubernetes_service_label_{sanitized(key)}",
                f"__meta_kubernetes_service_labelpresent_{sanitized(key)}",
            ],
            "regex": f"({value});true",
        }
        for key, value in monitor["spec"]["selector"]["matchLabels"].items()
    ]
    from_target = [
        {
            "source_labels": [
                "__meta_kubernetes_endpoint_address_target_kind",
                "__meta_kubernetes_endpoint_address_target_name",
            ],
            "separator": ";",
            "regex": f"{kind};(.*)",
            "replacement": "${1}",
            "target_label": label,
        }
        for kind, label in (("Node", "node"), ("Pod", "pod"))
    ]
    meta = [
        {"source_labels": [f"__meta_kubernetes_{source}"], "target_label": target}
        for source, target in (
            ("namespace", "namespace"),
            ("service_name", "service"),
            ("pod_name", "pod"),
            ("pod_container_name", "container"),
        )
    ]
    return {
        "job_name": f"serviceMonitor/{monitor['metadata']['namespace']}/"
        f"{monitor['metadata']['name']}/{index}{job_suffix}",
        "honor_labels": endpoint.get("honorLabels", False)
        if honor_labels is None
        else honor_labels,
        "metrics_path": endpoint.get("path", "/metrics"),
        "scrape_interval": "1s",
        "scrape_timeout": "1s",
        "relabel_configs": [
            {"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"},
            *keep_service,
            {
                "action": "keep",
                "source_labels": ["__meta_kubernetes_endpoint_port_name"],
                "regex": endpoint["port"],
            },
            *from_target,
            *meta,
            {
                "action": "drop",
                "source_labels": ["__meta_kubernetes_pod_phase"],
                "regex": "(Failed|Succeeded)",
            },
            {
                "source_labels": ["__meta_kubernetes_service_name"],
                "target_label": "job",
                "replacement": "${1}",
            },
            {"target_label": "endpoint", "replacement": endpoint["port"]},
        ],
    }


def discovered(service: dict[str, Any], pod: str, container: str, port: int) -> dict[str, Any]:
    """A static target with the labels Kubernetes' endpoints discovery gives the endpoint of
    `service` that `pod` backs (here, a port on loopback)."""
    labels = {
        "__meta_kubernetes_namespace": service["metadata"]["namespace"],
        "__meta_kubernetes_service_name": service["metadata"]["name"],
        "__meta_kubernetes_endpoint_port_name": service["spec"]["ports"][0]["name"],
        "__meta_kubernetes_endpoint_address_target_kind": "Pod",
        "__meta_kubernetes_endpoint_address_target_name": pod,
        "__meta_kubernetes_pod_name": pod,
        "__meta_kubernetes_pod_container_name": container,
        "__meta_kubernetes_pod_phase": "Running",
    }
    for key, value in service["metadata"]["labels"].items():
        labels[f"__meta_kubernetes_service_label_{sanitized(key)}"] = value
        labels[f"__meta_kubernetes_service_labelpresent_{sanitized(key)}"] = "true"
    return {"targets": [f"127.0.0.1:{port}"], "labels": labels}


@contextmanager
def serving(registry: CollectorRegistry) -> Iterator[int]:
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        yield int(server.server_port)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@contextmanager
def prometheus(tmp_path: Path, config: dict[str, Any]) -> Iterator[httpx.Client]:
    """A real Prometheus with this configuration, and an HTTP client of its API."""
    binary = shutil.which("prometheus")
    assert binary is not None
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = (tmp_path / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5)
    try:
        wait_until_ready(client, process)
        yield client
    finally:
        client.close()
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
        log.close()


def wait_until_ready(client: httpx.Client, process: subprocess.Popen[bytes]) -> None:
    """Prometheus answers 503 to queries until its storage is open; wait for /-/ready."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, "Prometheus exited while starting"
        try:
            if client.get("/-/ready").status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError("Prometheus was not ready within 60 s")


def query(client: httpx.Client, expr: str) -> list[dict[str, str]]:
    """The label sets of an instant query's series (empty while Prometheus is not ready)."""
    try:
        body = client.get("/api/v1/query", params={"query": expr}).json()
    except httpx.TransportError:
        return []
    assert body["status"] == "success", body
    return [series["metric"] for series in body["data"]["result"]]


def wait_for_series(client: httpx.Client, expr: str, count: int, log: Path) -> list[dict[str, str]]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = query(client, expr)
        if len(found) >= count:
            return found
        time.sleep(0.2)
    raise AssertionError(f"no {count} series of {expr} within 30 s; {log.read_text()[-3000:]}")


@pytest.mark.needs("prometheus")
def test_a_real_prometheus_keeps_the_models_namespace_and_pod(tmp_path: Path) -> None:
    rendering = render(VALUE_SETS["everything"])
    monitor = rendering.one("ServiceMonitor")
    [endpoint] = monitor["spec"]["endpoints"]
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [NAMESPACE]
    services = {
        component: rendering.one("Service", f"-{component}-metrics")
        for component in ("operator", "gateway")
    }
    operator = OperatorMetrics()
    operator.set_engine_states(MODEL_NAMESPACE, MODEL, {MODEL_POD: "awake"})
    gateway = GatewayMetrics()
    gateway.request_done(MODEL_NAMESPACE, MODEL, 200, 0.5)
    registries = {"operator": operator.registry, "gateway": gateway.registry}

    with ExitStack() as stack:
        # Each Service's endpoint twice: under the rendered endpoint, and the same without
        # honor_labels, each on a port of its own.
        configs = []
        for suffix, honor in (("", None), ("/without-honor-labels", False)):
            config = scrape_config(monitor, 0, job_suffix=suffix, honor_labels=honor)
            config["static_configs"] = [
                discovered(
                    services[component],
                    # A pod of the component's Deployment, as its ReplicaSet names it.
                    rendering.one("Deployment", f"-{component}")["metadata"]["name"]
                    + "-5c7d8-abcde",
                    component,
                    stack.enter_context(serving(registries[component])),
                )
                for component in ("operator", "gateway")
            ]
            configs.append(config)
        assert configs[0]["honor_labels"] is True, "the rendered endpoint honors labels"
        server = stack.enter_context(
            prometheus(
                tmp_path,
                {
                    "global": {"scrape_interval": "1s"},
                    "scrape_configs": configs,
                },
            )
        )
        log = tmp_path / "prometheus.log"
        state = wait_for_series(server, 'snooze_engine_state{state="awake"}', 2, log)
        requests = wait_for_series(server, 'snooze_gateway_requests_total{code="200"}', 2, log)
        ups = wait_for_series(server, "up == 1", 4, log)

    for series, component in ((state, "operator"), (requests, "gateway")):
        kept = [s for s in series if "exported_namespace" not in s]
        lost = [s for s in series if "exported_namespace" in s]
        assert len(kept) == len(lost) == 1, series
        # With honorLabels (the chart's): the model's namespace and pod.
        assert kept[0]["namespace"] == MODEL_NAMESPACE
        assert kept[0]["model"] == MODEL
        assert kept[0]["job"] == services[component]["metadata"]["name"]
        assert kept[0]["endpoint"] == endpoint["port"]
        # Without: the scraped pod's namespace, and the model's moved aside.
        assert lost[0]["namespace"] == NAMESPACE
        assert lost[0]["exported_namespace"] == MODEL_NAMESPACE
        if component == "operator":
            assert kept[0]["pod"] == MODEL_POD
            assert lost[0]["exported_pod"] == MODEL_POD
            assert lost[0]["pod"] != MODEL_POD

    # The targets are named as the Down alerts expect: each job matches its alert's matcher.
    jobs = {s["job"] for s in ups}
    assert jobs == {service["metadata"]["name"] for service in services.values()}
    rules = yaml.safe_load(RULES.read_text())["groups"][0]["rules"]
    exprs = {rule["alert"]: rule["expr"] for rule in rules}
    for alert, component in (("SnoozeOperatorDown", "operator"), ("SnoozeGatewayDown", "gateway")):
        [pattern] = re.findall(r'job=~"([^"]+)"', exprs[alert])
        assert [job for job in jobs if re.fullmatch(pattern, job)] == [
            services[component]["metadata"]["name"]
        ]
