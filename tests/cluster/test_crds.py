"""The CRDs on a real API server: applied with kubectl, explained from their OpenAPI, printed
with their columns, defaulted and pruned by their structural schemas, and guarded by their
CEL rules, which refuse what the docs say is refused."""

from __future__ import annotations

import json
from typing import Any

import builders
import pytest
from kube import Kube

from .conftest import ENGINES


def model(**spec: Any) -> dict[str, Any]:
    """The model the CRD checks apply: one name, in the engines' namespace, `spec` added."""
    labels = {"app.kubernetes.io/name": "crd-check"}
    return builders.model("crd-check", namespace=ENGINES, match_labels=labels, **spec)


@pytest.fixture
def clean(kube: Kube, crds: None) -> Any:
    yield
    kube.kubectl("delete", "im", "crd-check", "-n", ENGINES, "--ignore-not-found", check=False)


def refused(kube: Kube, body: dict[str, Any], *extra: str) -> str:
    done = kube.kubectl("apply", "-f", "-", *extra, input=json.dumps(body), check=False)
    assert done.returncode != 0, f"the API server took {body['spec']}"
    return done.stderr


def test_kubectl_explain_reads_the_real_openapi(kube: Kube, crds: None) -> None:
    idle = kube.kubectl("explain", "inferencemodel.spec.idle.after").stdout
    assert "How long an engine must see no request before it is put to sleep" in idle
    pool = kube.kubectl("explain", "gpupool.spec").stdout
    assert "memory" in pool


def test_defaults_are_applied_and_optional_features_stay_off(kube: Kube, clean: None) -> None:
    kube.apply(model())
    spec = kube.get("im", "crd-check", ENGINES)["spec"]
    assert spec["idle"]["after"] == "10m"
    assert spec["sleep"]["level"] == 1
    assert "pool" not in spec and "prewake" not in spec and "scaleToZeroAfter" not in spec


def test_printer_columns(kube: Kube, clean: None) -> None:
    """As the sandbox walkthrough (docs/getting-started.md) prints them; the wake's duration only
    with -o wide."""
    kube.apply(model())
    table = kube.kubectl("get", "im", "crd-check", "-n", ENGINES).stdout.splitlines()
    assert table[0].split() == ["NAME", "MODEL", "PHASE", "AWAKE", "ASLEEP", "LAST", "WAKE", "AGE"]
    assert table[1].split()[0] == "crd-check"
    wide = kube.kubectl("get", "im", "crd-check", "-n", ENGINES, "-o", "wide").stdout
    assert "WAKE SECONDS" in wide.splitlines()[0]


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ({"scaleToZeroAfter": "1h"}, "scaleToZeroAfter needs scaleTargetRef"),
        (
            {"scaleToZeroAfter": "1h", "idle": {"after": "Never"},
             "scaleTargetRef": {"kind": "Deployment", "name": "x"}},
            "scaleToZeroAfter needs idle.after to be a duration",
        ),
        (
            {"scaleToZeroAfter": "5m", "idle": {"after": "10m"},
             "scaleTargetRef": {"kind": "Deployment", "name": "x"}},
            "scaleToZeroAfter must be longer than idle.after",
        ),
        (
            {"scaleToZeroAfter": "20m", "idle": {"after": "Auto", "auto": {"max": "30m"}},
             "scaleTargetRef": {"kind": "Deployment", "name": "x"}},
            "scaleToZeroAfter must be longer than idle.auto.max",
        ),
        ({"selector": {"matchLabels": {}}}, "spec.selector.matchLabels"),
        ({"idle": {"after": "10 minutes"}}, "spec.idle.after"),
        ({"sleep": {"level": 3}}, "spec.sleep.level"),
    ],
)  # fmt: skip
def test_invalid_specs_are_refused(
    kube: Kube, clean: None, spec: dict[str, Any], says: str
) -> None:
    assert says in refused(kube, model(**spec))


def test_durations_the_pattern_takes_are_durations_to_cel(kube: Kube, clean: None) -> None:
    """Every form the CRD's pattern accepts must parse in CEL's duration(), or the rule that
    compares them fails on the server instead of answering."""
    target = {"kind": "Deployment", "name": "x"}
    kube.apply(model(idle={"after": "1.5m"}, scaleToZeroAfter="1h30m", scaleTargetRef=target))
    kube.apply(model(idle={"after": "90s"}, scaleToZeroAfter="2h", scaleTargetRef=target))
    kube.apply(model(idle={"after": "500ms"}, scaleToZeroAfter="1m", scaleTargetRef=target))


def test_unknown_fields_are_refused_or_pruned(kube: Kube, clean: None) -> None:
    body = model(idel={"after": "1m"})
    assert 'unknown field "spec.idel"' in refused(kube, body)
    kube.apply(body, "--validate=false")
    assert "idel" not in kube.get("im", "crd-check", ENGINES)["spec"]


def test_server_side_apply_tracks_field_managers(kube: Kube, clean: None) -> None:
    kube.kubectl("apply", "--server-side", "--field-manager=team-a", "-f", "-",
                 input=json.dumps(model(idle={"after": "5m"})))  # fmt: skip
    conflict = kube.kubectl(
        "apply", "--server-side", "--field-manager=team-b", "-f", "-",
        input=json.dumps(model(idle={"after": "7m"})), check=False,
    )  # fmt: skip
    assert conflict.returncode != 0 and "conflict" in conflict.stderr.lower(), conflict.stderr
    managed = json.loads(
        kube.kubectl(
            "get", "im", "crd-check", "-n", ENGINES, "-o", "json", "--show-managed-fields"
        ).stdout
    )["metadata"]["managedFields"]
    assert {"team-a"} <= {entry["manager"] for entry in managed}


def test_status_is_a_subresource(kube: Kube, clean: None) -> None:
    """A write to the object cannot set status, and a status write cannot change the spec."""
    body = model()
    body["status"] = {"phase": "Awake"}
    kube.apply(body)
    assert (
        "status" not in kube.get("im", "crd-check", ENGINES)
        or kube.get("im", "crd-check", ENGINES)["status"].get("phase") != "Awake"
    )
    kube.kubectl(
        "patch", "im", "crd-check", "-n", ENGINES, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {"phase": "Asleep", "madeUp": 1}, "spec": {"minAwake": 3}}),
    )  # fmt: skip
    stored = kube.get("im", "crd-check", ENGINES)
    assert stored["status"]["phase"] == "Asleep"
    assert "madeUp" not in stored["status"], "an undeclared status field was kept"
    assert stored["spec"].get("minAwake", 0) != 3
