"""Tables without kubectl: the JSONPath subset, ages, and how CRD column cells are typed."""

from __future__ import annotations

import pytest

from snooze.sandbox import jsonpath, printers, tables
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
