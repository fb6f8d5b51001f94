"""values.yaml, every ci/*-values.yaml and the templates' `.Values` paths agree with the schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from chart_helpers import CHART, load_yaml, merged, value_paths, value_refs, values

SCHEMA = json.loads((CHART / "values.schema.json").read_text())
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))


def test_schema_is_a_valid_draft7_schema() -> None:
    jsonschema.Draft7Validator.check_schema(SCHEMA)


def test_values_yaml_starts_with_the_schema_header() -> None:
    first = (CHART / "values.yaml").read_text().splitlines()[0]
    assert first == "# yaml-language-server: $schema=values.schema.json"


def test_default_values_validate() -> None:
    jsonschema.validate(values(), SCHEMA)


def test_there_are_ci_values() -> None:
    assert len(CI_VALUES) >= 3


@pytest.mark.parametrize("path", CI_VALUES, ids=lambda p: p.name)
def test_ci_values_validate(path: Path) -> None:
    """As Helm does: the file coalesced onto the defaults, then validated."""
    override = load_yaml(path)
    jsonschema.validate(override, SCHEMA)
    jsonschema.validate(merged(values(), override), SCHEMA)


def _closed(schema: dict[str, Any], path: str = "") -> list[str]:
    """Objects with fixed keys that do not refuse unknown ones."""
    open_ones = []
    if "properties" in schema and schema.get("additionalProperties") is not False:
        open_ones.append(path or "(root)")
    for name, sub in schema.get("properties", {}).items():
        open_ones += _closed(sub, f"{path}.{name}")
    return open_ones


def test_every_object_with_known_keys_refuses_unknown_ones() -> None:
    assert _closed(SCHEMA) == []


def test_every_default_key_is_in_the_schema() -> None:
    """The other direction: no key of values.yaml is described only by being allowed."""

    def walk(node: Any, schema: dict[str, Any], path: str) -> list[str]:
        missing = []
        if isinstance(node, dict) and "properties" in schema:
            for key, value in node.items():
                if key not in schema["properties"]:
                    missing.append(f"{path}.{key}")
                else:
                    missing += walk(value, schema["properties"][key], f"{path}.{key}")
        return missing

    assert walk(values(), SCHEMA, "") == []


# (override, what the error must name)
REFUSED: list[tuple[str, dict[str, Any], str]] = [
    ("unknown top-level key", {"replicas": 2}, "replicas"),
    ("typo in operator", {"operator": {"replica": 2}}, "replica"),
    ("typo in gateway service", {"gateway": {"service": {"typ": "ClusterIP"}}}, "typ"),
    ("unknown networkPolicy key", {"networkPolicy": {"podSelector": {}}}, "podSelector"),
    ("replicas as a string", {"operator": {"replicas": "2"}}, "replicas"),
    ("port out of range", {"gateway": {"port": 70000}}, "port"),
    ("bad pull policy", {"image": {"pullPolicy": "Sometimes"}}, "pullPolicy"),
    ("bad namespace name", {"watchNamespaces": ["Team_A"]}, "watchNamespaces"),
    ("bad scrape interval", {"serviceMonitor": {"interval": "30 seconds"}}, "interval"),
    (
        "label value not a string",
        {"grafanaDashboard": {"labels": {"grafana_dashboard": 1}}},
        "labels",
    ),
    ("empty engine selector", {"networkPolicy": {"enginePodSelector": {}}}, "enginePodSelector"),
    ("zero probe interval", {"operator": {"probeInterval": 0}}, "probeInterval"),
    ("zero probe interval as a duration", {"operator": {"probeInterval": "0s"}}, "probeInterval"),
    ("probe interval not a duration", {"operator": {"probeInterval": "10 s"}}, "probeInterval"),
    ("zero drain timeout", {"operator": {"drainTimeout": 0}}, "drainTimeout"),
    ("zero shutdown grace", {"gateway": {"shutdownGraceSeconds": 0}}, "shutdownGrace"),
    (
        "unknown scraper key",
        {"networkPolicy": {"scraper": {"namespaces": ["monitoring"]}}},
        "namespaces",
    ),
    (
        "scraper namespace not a name",
        {"networkPolicy": {"scraper": {"namespace": "Monitoring"}}},
        "namespace",
    ),
    ("typo in the pod security context", {"podSecurityContext": {"runAsUsr": 0}}, "runAsUsr"),
    ("negative uid", {"podSecurityContext": {"runAsUser": -1}}, "runAsUser"),
    (
        "unknown capability key",
        {"containerSecurityContext": {"capabilities": {"remove": ["ALL"]}}},
        "remove",
    ),
    (
        "budget neither count nor percentage",
        {"gateway": {"podDisruptionBudget": {"maxUnavailable": "half"}}},
        "maxUnavailable",
    ),
    ("negative shutdown grace", {"gateway": {"shutdownGraceSeconds": -1}}, "shutdownGrace"),
    ("zero client read timeout", {"gateway": {"clientReadTimeout": 0}}, "clientReadTimeout"),
    (
        "start timeout not a duration",
        {"gateway": {"upstreamStartTimeout": "90 s"}},
        "upstreamStartTimeout",
    ),
    (
        "runbook address with a fragment",
        {"prometheusRule": {"runbookBaseURL": "https://docs/x#y"}},
        "runbookBaseURL",
    ),
]


@pytest.mark.parametrize(("case", "override", "field"), REFUSED, ids=[c[0] for c in REFUSED])
def test_schema_refuses(case: str, override: dict[str, Any], field: str) -> None:
    candidate = merged(values(), override)
    if "enginePodSelector" in override.get("networkPolicy", {}):
        candidate["networkPolicy"]["enginePodSelector"] = {}
    errors = list(jsonschema.Draft7Validator(SCHEMA).iter_errors(candidate))
    assert errors, f"{case}: accepted"
    where = " ".join(
        ".".join(str(p) for p in error.absolute_path) + " " + error.message for error in errors
    )
    assert field in where, where


def test_every_value_a_template_reads_exists() -> None:
    known = set(value_paths(values()))
    missing = {".".join(path): files for path, files in value_refs().items() if path not in known}
    assert missing == {}


def test_every_value_is_read_by_a_template() -> None:
    """A key no template reads is a knob that does nothing: reading a map covers its keys."""
    refs = set(value_refs())
    paths = set(value_paths(values()))
    leaves = {
        path for path in paths if not any(other[: len(path)] == path != other for other in paths)
    }
    unread = sorted(
        ".".join(path) for path in leaves if not any(path[: len(ref)] == ref for ref in refs)
    )
    assert unread == []
