"""The endpoint pickers' queues as data: the gauge summed from a picker's page (and the pages a
hostile picker sends refused), an InferencePool read from what the API lists, the addresses
behind a Service, which pools serve a model, and when a queue asks for a wake. Names are data:
a model named like a label value, a label, or a word of the code is only ever that name."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

import snooze
from snooze.api.conditions import ConditionReason
from snooze.api.reasons import FailureReason
from snooze.kube.inferencepools import InferencePool, read_pool, ready_addresses
from snooze.operator.traffic.pickerpage import QUEUE_SIZE, read_queue, unescaped
from snooze.policy.pickers import pools_serving, selects
from snooze.policy.wakes import queue_wakes, wake_pending

GIE = QUEUE_SIZE
LLMD = "llm_d_epp_flow_control_queue_size"


def series(name: str, target: str, value: str, *, fairness: str = "", priority: str = "0") -> str:
    return (
        f'{name}{{fairness_id="{fairness}",priority="{priority}",inference_pool="pool",'
        f'model_name="{target}",target_model_name="{target}"}} {value}\n'
    )


# -- The gauge -------------------------------------------------------------------------------


def test_the_queue_is_summed_over_fairness_ids_priorities_and_both_names() -> None:
    page = (
        f"# HELP {GIE} Current number of requests actively held in the Flow Control queue.\n"
        f"# TYPE {GIE} gauge\n"
        + series(GIE, "qwen", "2", fairness="tenant-a")
        + series(GIE, "qwen", "3", fairness="tenant-b", priority="-1")
        + series(GIE, "llama", "0")
        + series(LLMD, "qwen", "1")
        # Other families of the page, histograms among them, are not read.
        + 'inference_objective_request_total{model_name="qwen",target_model_name="qwen"} 99\n'
        + f'{GIE}_bytes{{target_model_name="qwen"}} 1e6\n'
    )
    assert read_queue(page) == {"qwen": 6}


def test_a_queue_of_another_target_is_not_the_models() -> None:
    """target_model_name is the model sent to the engine: model_name is what clients asked for
    (before the picker's rewrites)."""
    page = (
        f'{GIE}{{fairness_id="",priority="0",inference_pool="p",model_name="qwen",'
        f'target_model_name="qwen-lora"}} 4\n'
    )
    assert read_queue(page) == {"qwen-lora": 4}


@pytest.mark.parametrize(
    "target",
    [
        "Qwen/Qwen3-8B",
        "target_model_name",
        "model_name",
        "inference_pool",
        "pool",
        'a "quoted" name',
        "back\\slash",
        "line\nbreak",
        "",
        "app.kubernetes.io/name",
        "qwen,target_model_name=other",
    ],
)
def test_a_model_name_is_read_back_as_written(target: str) -> None:
    escaped = target.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    page = f'{GIE}{{fairness_id="x",priority="0",model_name="m",target_model_name="{escaped}"}} 2\n'
    assert read_queue(page) == {target: 2}
    assert unescaped(escaped) == target


def test_a_series_without_a_target_belongs_to_no_model() -> None:
    assert read_queue(f'{GIE}{{fairness_id="x",priority="0"}} 5\n') == {}
    assert read_queue(f"{GIE} 5\n") == {}


@pytest.mark.parametrize(
    "page",
    [
        series(GIE, "qwen", "NaN"),
        series(GIE, "qwen", "+Inf"),
        series(GIE, "qwen", "-1"),
        series(GIE, "qwen", "1e12"),
        series(GIE, "qwen", "600000") + series(GIE, "qwen", "600000", fairness="b"),
        series(GIE, "qwen", "two"),
        series(GIE, "qwen", "1") + series(GIE, "qwen", "1"),  # a series sent twice
        f'{GIE}{{target_model_name="qwen" 1\n',
        f'{GIE}{{target_model_name="\\q"}} 1\n',
        f'{GIE}{{target_model_name="qwen"}}\n',
        GIE + "{" + "x" * 70_000 + "}\n",
    ],
    ids=[
        "nan",
        "infinite",
        "negative",
        "beyond any count",
        "summed beyond any count",
        "not a number",
        "twice",
        "unclosed",
        "unknown escape",
        "no value",
        "endless line",
    ],
)
def test_a_page_no_picker_writes_is_refused_whole(page: str) -> None:
    with pytest.raises(ValueError):
        read_queue(series(GIE, "other", "1") + page)


def test_too_many_series_are_refused() -> None:
    page = "".join(series(GIE, f"m{i}", "1") for i in range(65537))
    with pytest.raises(ValueError, match="more than 65536 series"):
        read_queue(page)


# -- An InferencePool ------------------------------------------------------------------------


# Not tests/builders.py's gpu_pool: the Inference Extension's InferencePool.
def pool_body(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "selector": {"matchLabels": {"app": "qwen"}},
        "targetPorts": [{"number": 8000}],
        "endpointPickerRef": {"name": "qwen-epp", "port": {"number": 9002}},
    }
    base.update(spec)
    return {"metadata": {"name": "qwen-pool", "namespace": "llm"}, "spec": base}


def test_a_pool_as_the_api_lists_it() -> None:
    pool = read_pool(pool_body())
    assert pool == InferencePool(
        namespace="llm",
        name="qwen-pool",
        selector={"app": "qwen"},
        picker="qwen-epp",
        port_name="http-metrics",
    )
    explicit = pool_body(endpointPickerRef={"group": "", "kind": "Service", "name": "e"})
    assert read_pool(explicit).picker == "e" and not read_pool(explicit).problem
    annotated = pool_body()
    annotated["metadata"]["annotations"] = {"snooze.dev/picker-metrics-port": "metrics"}
    assert read_pool(annotated).port_name == "metrics"


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ({"endpointPickerRef": {"name": "e", "kind": "Gateway"}}, "names a Gateway"),
        ({"endpointPickerRef": {"name": "e", "group": "example.com"}}, "of group 'example.com'"),
        ({"endpointPickerRef": {"kind": "Service"}}, "names no picker"),
        ({"endpointPickerRef": {"name": 7}}, "names no picker"),
        ({"endpointPickerRef": "e"}, "names no picker"),
        ({"selector": {"matchLabels": {"app": 7}}}, "not a map of labels"),
        ({"selector": {"matchLabels": ["app"]}}, "not a map of labels"),
        ({"selector": "app=qwen"}, "not a map of labels"),
    ],
)
def test_a_pool_whose_picker_cannot_be_read_says_why(spec: dict[str, Any], said: str) -> None:
    pool = read_pool(pool_body(**spec))
    assert said in pool.problem and pool.picker == ""


def test_a_pool_that_is_not_even_an_object_is_read_without_a_crash() -> None:
    assert read_pool({"metadata": "x", "spec": None}).problem
    body = pool_body()
    body["metadata"]["annotations"] = {"snooze.dev/picker-metrics-port": 9090}
    assert "not a port's name" in read_pool(body).problem


# -- The addresses behind a Service ----------------------------------------------------------


def endpoint_slice(*addresses: tuple[str, bool | None], ports: list[dict[str, Any]]) -> Any:
    endpoints = []
    for address, ready in addresses:
        conditions = {} if ready is None else {"ready": ready}
        endpoints.append({"addresses": [address], "conditions": conditions})
    return {"ports": ports, "endpoints": endpoints}


def test_the_ready_addresses_on_the_named_port() -> None:
    ports = [{"name": "grpc-ext-proc", "port": 9002}, {"name": "http-metrics", "port": 9090}]
    slices = [
        endpoint_slice(("10.0.0.1", True), ("10.0.0.2", False), ("fd00::3", None), ports=ports),
        endpoint_slice(("10.0.0.4", True), ports=[{"name": "other", "port": 1}]),
    ]
    assert ready_addresses(slices, "http-metrics") == (["10.0.0.1:9090", "[fd00::3]:9090"], True)
    assert ready_addresses(slices, "metrics-x") == ([], False)
    # Without a name (the gateway's own Service): `metrics`, else the first port.
    assert ready_addresses(slices, None) == (
        ["10.0.0.1:9002", "[fd00::3]:9002", "10.0.0.4:1"],
        True,
    )


def test_hostile_endpoint_slices_are_read_without_a_crash() -> None:
    slices: list[Any] = [
        {"ports": ["x", {"name": "http-metrics", "port": "9090"}], "endpoints": [{}]},
        {"ports": [{"name": "http-metrics", "port": 9090}], "endpoints": ["x", {"addresses": [7]}]},
    ]
    assert ready_addresses(slices, "http-metrics") == ([], True)


# -- Which pools serve a model ---------------------------------------------------------------


def pool(name: str, **labels: str) -> InferencePool:
    return InferencePool(namespace="llm", name=name, selector=labels, picker=f"{name}-epp")


def test_a_pool_serves_a_model_whose_pods_it_selects() -> None:
    qwen, llama, both = pool("qwen", app="qwen"), pool("llama", app="llama"), pool("all")
    pods = [{"app": "qwen", "tier": "gpu"}]
    assert pools_serving([qwen, llama, both], pods) == [qwen, both]
    assert pools_serving([qwen, llama], [{"app": "mistral"}]) == []
    assert pools_serving([qwen], []) == []


@pytest.mark.parametrize(
    ("selector", "labels", "selected"),
    [
        ({"app": "qwen"}, {"app": "qwen"}, True),
        ({"app": "qwen", "tier": "gpu"}, {"app": "qwen"}, False),
        # A value that is another's key, or a word the code uses, is only a value.
        ({"app": "app"}, {"app": "qwen", "qwen": "app"}, False),
        ({"app": "selector"}, {"app": "selector"}, True),
        ({"matchLabels": "app"}, {"app": "qwen"}, False),
        ({"app": ""}, {}, False),
        ({"app": ""}, {"app": ""}, True),
        ({"app": "qwen"}, {"app": "Qwen"}, False),
        ({"app": "qwen"}, {"app": "qwen "}, False),
        ({}, {"anything": "x"}, True),
    ],
)
def test_selects(selector: dict[str, str], labels: dict[str, str], selected: bool) -> None:
    assert selects(selector, labels) is selected


# -- When a queue asks for a wake ------------------------------------------------------------

NOW = 1000.0


@pytest.mark.parametrize(
    ("queued", "awake", "requested_at", "slept_at", "wakes"),
    [
        (0, 0, None, NOW - 50, False),  # nothing queued
        (None, 0, None, NOW - 50, False),  # not known
        (3, 1, None, NOW - 50, False),  # an engine serves: the picker sends it there
        (3, 0, None, NOW - 50, True),  # the first of a burst
        (3, 0, NOW - 1, NOW - 50, False),  # asked a moment ago: once per burst
        (3, 0, NOW - 30, NOW - 50, False),  # that wake is under way (timeout 120 s)
        (3, 0, NOW - 200, NOW - 300, True),  # that wake timed out: ask again
        (3, 0, NOW - 60, NOW - 50, True),  # the model slept after it: a new burst
    ],
)
def test_queue_wakes(
    queued: int | None,
    awake: int,
    requested_at: float | None,
    slept_at: float | None,
    wakes: bool,
) -> None:
    pending = wake_pending(
        requested_at=requested_at, slept_at=slept_at, now=NOW, wake_timeout=120.0, recent=5.0
    )
    assert queue_wakes(queued=queued, awake=awake, pending=pending) is wakes


# -- What the docs say of it -----------------------------------------------------------------

READERS = [
    "operator/traffic/pickers.py",
    "operator/traffic/pickerpage.py",
    "operator/traffic/pickerwake.py",
    "kube/inferencepools.py",
    "policy/pickers.py",
]


def test_every_reason_a_picker_read_can_give_is_on_the_inference_gateway_page() -> None:
    """The reasons of PickerReadable False, found where the code that reads a picker names
    them: each is explained on docs/inference-gateway.md."""
    enums = {"ConditionReason": ConditionReason, "FailureReason": FailureReason}
    package = Path(snooze.__file__).parent
    named: set[str] = set()
    for module in READERS:
        for node in ast.walk(ast.parse((package / module).read_text())):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in enums
            ):
                named.add(enums[node.value.id][node.attr].value)
    named.discard(ConditionReason.READ.value)  # True: nothing to explain
    page = (package.parents[1] / "docs/inference-gateway.md").read_text()
    assert len(named) > 10, named
    assert sorted(r for r in named if f"`{r}`" not in page) == []
