"""Tables without kubectl: the JSONPath subset, ages, and how CRD column cells are typed."""

from __future__ import annotations

import pytest

from snooze.sandbox import jsonpath, printers, tables
from snooze.sandbox.api import ApiError
from snooze.sandbox.discovery import PrinterColumn, ResourceSpec

OBJ = {
    "metadata": {"name": "m", "creationTimestamp": "2020-01-01T00:00:00Z"},
    "status": {
        "phase": "Asleep",
        "awake": 1.0,
        "conditions": [
            {"type": "Scheduled", "status": "True"},
            {"type": "Ready", "status": "False"},
        ],
        "labels": {"a": "b"},
    },
}


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (".status.phase", ["Asleep"]),
        ("{.status.phase}", ["Asleep"]),
        (".status.missing.deeper", []),
        (".status.conditions[1].type", ["Ready"]),
        (".status.conditions[-1].status", ["False"]),
        ('.status.conditions[?(@.type=="Ready")].status', ["False"]),
        (".status.conditions[?(@.type=='Scheduled')].status", ["True"]),
        (".status.conditions[*].type", ["Scheduled", "Ready"]),
        (".status['phase']", ["Asleep"]),
    ],
)
def test_jsonpath(path: str, expected: list[str]) -> None:
    assert jsonpath.find(OBJ, jsonpath.parse(path)) == expected


def test_jsonpath_refuses_what_it_does_not_know() -> None:
    with pytest.raises(jsonpath.JSONPathError):
        jsonpath.parse(".status..phase")


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (-5, "<invalid>"),
        (-1, "0s"),
        (119, "119s"),
        (150, "2m30s"),
        (600, "10m"),
        (3 * 3600, "3h"),
        (8 * 3600 + 60, "8h"),
        (50 * 3600, "2d2h"),
        (9 * 86400, "9d"),
        (3 * 365 * 86400, "3y"),
    ],
)
def test_human_duration(seconds: int, shown: str) -> None:
    assert printers.human_duration(seconds) == shown


def test_crd_cells_are_typed_like_the_server() -> None:
    columns = (
        PrinterColumn(name="Awake", type="integer", json_path=".status.awake"),
        PrinterColumn(name="Labels", type="string", json_path=".status.labels"),
        PrinterColumn(name="Gone", type="string", json_path=".status.gone"),
        PrinterColumn(name="Bad", type="string", json_path=".status[?oops]"),
        PrinterColumn(name="Created", type="date", json_path=".metadata.creationTimestamp"),
        PrinterColumn(name="Wrong", type="date", json_path=".status.phase"),
    )
    spec = ResourceSpec(
        group="g", version="v1", plural="ms", kind="M", singular="m", namespaced=True,
        custom=True, printer_columns=columns,
    )  # fmt: skip
    result = tables.table(spec, [OBJ], {})
    assert [c["name"] for c in result["columnDefinitions"]][:2] == ["Name", "Awake"]
    cells = result["rows"][0]["cells"]
    assert cells[:5] == ["m", 1, '{"a":"b"}', None, None]
    assert cells[5].endswith(("y", "d")) and cells[6] == "<invalid>"


KUBECTL_ACCEPT = (
    "application/json;as=Table;v=v1;g=meta.k8s.io,"
    "application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
)


@pytest.mark.parametrize(
    ("accept", "query", "expected"),
    [
        (KUBECTL_ACCEPT, {}, tables.TableRequest()),
        ("application/json;as=Table;v=v1beta1;g=meta.k8s.io", {"includeObject": "Object"},
         tables.TableRequest(api_version="meta.k8s.io/v1beta1", include_object="Object")),
        ("application/json, application/json;as=Table;v=v1;g=meta.k8s.io", {}, None),
        ("application/json;as=Table;v=v2;g=meta.k8s.io,application/json", {}, None),
        ("", {}, None),
    ],
)  # fmt: skip
def test_table_negotiation(
    accept: str, query: dict[str, str], expected: tables.TableRequest | None
) -> None:
    assert tables.requested(accept, query) == expected


def test_table_refuses_an_unknown_include_object() -> None:
    with pytest.raises(ApiError, match="unrecognized includeObject"):
        tables.requested(KUBECTL_ACCEPT, {"includeObject": "Everything"})


POD_SPEC = ResourceSpec(
    group="", version="v1", plural="pods", kind="Pod", singular="pod", namespaced=True
)


def test_rows_carry_metadata_unless_asked_otherwise() -> None:
    pod = {"metadata": {"name": "p", "labels": {"a": "b"}}, "spec": {"containers": [{}]}}
    default = tables.table(POD_SPEC, [pod], {}, tables.TableRequest())["rows"][0]["object"]
    assert default == {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": pod["metadata"],
    }
    whole = tables.TableRequest(include_object="Object")
    assert tables.table(POD_SPEC, [pod], {}, whole)["rows"][0]["object"] == pod
    nothing = tables.TableRequest(include_object="None")
    assert tables.table(POD_SPEC, [pod], {}, nothing)["rows"][0]["object"] is None


def test_watch_tables_have_headers_once() -> None:
    render = tables.watch_renderer(POD_SPEC, tables.TableRequest())
    pod = {"metadata": {"name": "p", "resourceVersion": "7"}, "spec": {"containers": [{}]}}
    first, second = (render({"type": t, "object": pod}) for t in ("ADDED", "MODIFIED"))
    assert [c["name"] for c in first["object"]["columnDefinitions"]][:2] == ["Name", "Ready"]
    assert second["object"]["columnDefinitions"] is None
    assert [len(e["object"]["rows"]) for e in (first, second)] == [1, 1]
    assert first["object"]["metadata"] == {"resourceVersion": "7"}
    error = {"type": "ERROR", "object": {"kind": "Status", "code": 410}}
    assert render(error) == error
    assert tables.watch_renderer(POD_SPEC, None)(first) is first
