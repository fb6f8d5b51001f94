"""The Grafana dashboard is pretty-printed JSON whose every query parses and uses real metrics."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import promql_parser
import pytest
from chart_helpers import CHART
from prometheus_client import CollectorRegistry

from snooze.gateway.metrics import GatewayMetrics
from snooze.operator.metrics import OperatorMetrics

PATH = CHART / "dashboards" / "snooze.json"
# What Grafana puts in place of its variables, for parsing (any valid value would do).
VARIABLES = {
    "$namespace": "default",
    "$model": "chat",
    "$pool": "gpu-0",
    "$__rate_interval": "1m",
    "$__range": "5m",
    "$__interval": "30s",
}
LABEL_VALUES = re.compile(r"^label_values\((?:(.+), )?(\w+)\)$")


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(PATH.read_text())
    return loaded


def panels(node: dict[str, Any] | None = None) -> Iterator[dict[str, Any]]:
    """Every panel, those inside rows too."""
    for panel in (node or dashboard())["panels"]:
        yield panel
        yield from panels(panel) if panel.get("panels") else ()


def targets() -> list[tuple[str, str]]:
    return [
        (panel["title"], target["expr"])
        for panel in panels()
        for target in panel.get("targets", [])
    ]


def substitute(expr: str) -> str:
    # Longest first: $__range must not eat the start of a longer name.
    for name in sorted(VARIABLES, key=len, reverse=True):
        expr = expr.replace(name, VARIABLES[name])
    assert "$" not in expr, f"an unknown Grafana variable in {expr}"
    return expr


def metric_names(expr: str) -> set[str]:
    names: set[str] = set()

    def visit(node: promql_parser.Expr) -> None:
        if isinstance(node, promql_parser.VectorSelector) and node.name:
            names.add(node.name)

    promql_parser.walk(promql_parser.parse(substitute(expr)), visit)
    return names


def exported_names() -> set[str]:
    """Every series name the operator and the gateway export, suffixes (_bucket) included."""
    operator, gateway = OperatorMetrics(), GatewayMetrics()
    operator.wake_duration.labels("ns", "m", "1").observe(1)
    gateway.request_done("ns", "m", 200, 1)
    registries: list[CollectorRegistry] = [operator.registry, gateway.registry]
    names = set()
    for registry in registries:
        for family in registry.collect():
            names.add(family.name)
            names.update(sample.name for sample in family.samples)
            # Counters and histograms exist once their children do; their names are fixed.
            if family.type == "counter":
                names.add(f"{family.name}_total")
            if family.type == "histogram":
                names.update(f"{family.name}_{suffix}" for suffix in ("bucket", "sum", "count"))
    return names


def test_pretty_printed_with_a_stable_uid() -> None:
    text = PATH.read_text()
    assert text == json.dumps(json.loads(text), indent=2) + "\n", "re-dump it with indent=2"
    board = dashboard()
    assert board["uid"] == "snooze-overview"
    assert board["title"] == "Snooze"


def test_variables_datasource_namespace_model_and_pool() -> None:
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    assert set(variables) == {"datasource", "namespace", "model", "pool"}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    names = exported_names()
    for name in ("namespace", "model", "pool"):
        variable = variables[name]
        assert variable["type"] == "query" and variable["datasource"]["uid"] == "${datasource}"
        match = LABEL_VALUES.match(variable["query"]["query"])
        assert match, variable["query"]
        selector, label = match.groups()
        assert label == name
        assert metric_names(selector) <= names
        # The label must be on that metric (snooze_models, for one, has only `phase`).
        [metric] = metric_names(selector)
        assert label in _labels_of(metric), f"{metric} has no label {label}"


def _labels_of(metric: str) -> set[str]:
    operator = OperatorMetrics()
    operator.set_engine_states("ns", "m", {"pod": "awake"})
    operator.set_pool_memory("ns", "gpu", awake=1, asleep=0, free=1)
    for family in operator.registry.collect():
        for sample in family.samples:
            if sample.name == metric:
                return set(sample.labels)
    raise AssertionError(f"{metric} is not an operator metric")


def test_every_panel_uses_the_datasource_variable() -> None:
    for panel in panels():
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]


def test_panel_ids_are_unique_and_panels_fit_the_grid() -> None:
    ids = [panel["id"] for panel in panels()]
    assert len(ids) == len(set(ids))
    for panel in panels():
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]


def test_the_issue_s_panels_are_there() -> None:
    exprs = " ".join(expr for _title, expr in targets())
    for needle in [
        "snooze_models",
        "snooze_engine_state",
        # Wakes and engines by engine kind (vLLM, SGLang), joined on the models' kinds.
        "histogram_quantile(0.5, sum by (le, engine) (rate(snooze_wake_duration_seconds_bucket",
        "histogram_quantile(0.95, sum by (le, engine) (rate(snooze_wake_duration_seconds_bucket",
        "histogram_quantile(0.99, sum by (le, engine) (rate(snooze_wake_duration_seconds_bucket",
        "sum by (engine, state) (snooze_engine_state{",
        "group_left(engine) snooze_model_engine_info",
        "snooze_wake_failures_total",
        "sum by (check, result) (increase(snooze_wake_verifications_total{",
        "snooze_gateway_held_requests",
        "snooze_gateway_hold_duration_seconds_bucket",
        "sum(increase(snooze_asleep_seconds_total{",
        "snooze_gateway_requests_total",
        "snooze_gateway_rejected_requests_total",
        # GPU pools: memory used (awake and asleep) and free, awake members, waiting wakes,
        # evictions, the wait for room and wakes out of memory.
        "sum by (pool, state) (snooze_pool_memory_bytes{",
        "snooze_pool_awake_members",
        "snooze_pool_waiting_wakes",
        "rate(snooze_pool_evictions_total{",
        "rate(snooze_pool_wait_seconds_bucket{",
        "snooze_pool_oom_total",
    ]:
        assert needle in exprs, needle


@pytest.mark.parametrize(("title", "expr"), targets(), ids=lambda x: str(x)[:40])
def test_every_query_parses_and_uses_exported_metrics(title: str, expr: str) -> None:
    used = metric_names(expr)
    assert used, f"{title}: no metric in {expr}"
    assert used <= exported_names(), f"{title}: {used - exported_names()} are exported by neither"
    # Per-model panels follow the variables (snooze_models has no such labels), per-pool
    # panels the namespace and pool ones.
    if all(name.startswith("snooze_pool_") for name in used):
        assert 'namespace=~"$namespace"' in expr and 'pool=~"$pool"' in expr, title
    elif used != {"snooze_models"}:
        assert 'namespace=~"$namespace"' in expr and 'model=~"$model"' in expr, title
