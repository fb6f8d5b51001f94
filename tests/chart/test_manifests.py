"""Static manifests pass kubernetes-validate, the chart's files exist, its flags are the CLI's."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from chart_helpers import (
    CHART,
    CRDS,
    EXAMPLES,
    TEMPLATES,
    crd_strict_schema,
    load_yaml,
    values,
)
from rendering import VALUE_SETS, render

from snooze.api import models

STATIC = sorted([*CRDS.glob("*.yaml"), *(CHART / "crds").glob("*.yaml"), *EXAMPLES.glob("*.yaml")])
# kopf's peering CRDs, which only the chart installs (crds/ is the snooze.dev API alone).
CHART_ONLY_CRDS = {"kopfpeerings.kopf.dev.yaml"}


def _documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def test_chart_crds_are_identical_to_crds() -> None:
    for source in sorted(CRDS.glob("*.yaml")):
        copy = CHART / "crds" / source.name
        assert copy.is_file(), f"charts/snooze/crds/{source.name} is missing"
        assert copy.read_bytes() == source.read_bytes(), (
            f"charts/snooze/crds/{source.name} differs: cp crds/{source.name} charts/snooze/crds/"
        )
    extra = {p.name for p in (CHART / "crds").iterdir()} - {p.name for p in CRDS.iterdir()}
    assert extra == CHART_ONLY_CRDS


def test_static_manifests_pass_kubernetes_validate_strict() -> None:
    """One run over every file (it is slow to start); only InferenceModels have no schema
    there, and those are validated against the CRD below."""
    result = subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "--strict", *map(str, STATIC)],
        capture_output=True,
        text=True,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    unknown = re.findall(r"Couldn't find schema for kind (\S+) with api version (\S+)", output)
    assert set(unknown) <= {(models.KIND, models.API_VERSION)}, output
    passed = len(re.findall(r"^INFO .* passed for resource", output, re.M))
    documents = sum(len(_documents(path)) for path in STATIC)
    assert passed + len(unknown) == documents, output


INFERENCE_MODELS = [
    (path, doc)
    for path in sorted(EXAMPLES.glob("*.yaml"))
    for doc in _documents(path)
    if doc.get("kind") == models.KIND
]


@pytest.mark.parametrize(
    ("path", "resource"), INFERENCE_MODELS, ids=lambda x: getattr(x, "name", "")
)
def test_example_inference_models_validate_against_the_crd(
    path: Path, resource: dict[str, Any]
) -> None:
    jsonschema.validate(resource, crd_strict_schema())
    models.parse_spec(resource["spec"])


def test_examples_show_the_common_cases() -> None:
    specs = [models.parse_spec(doc["spec"]) for _path, doc in INFERENCE_MODELS]
    cases = {(spec.sleep.level, spec.wake.on_failure) for spec in specs}
    # Restart is the default (level1 says nothing), Report an explicit choice.
    assert {(1, "Restart"), (2, "Report"), (2, "Restart")} <= cases


def _engine_deployments() -> list[dict[str, Any]]:
    return [
        doc
        for path in sorted(EXAMPLES.glob("*.yaml"))
        for doc in _documents(path)
        if doc.get("kind") == "Deployment"
    ]


def test_example_engine_has_sleep_mode_dev_mode_and_the_labels() -> None:
    """The vLLM example is what Snooze needs, selected by the chart's NetworkPolicy and by
    an example InferenceModel."""
    [deployment] = _engine_deployments()
    pod = deployment["spec"]["template"]
    [container] = pod["spec"]["containers"]
    assert container["command"] == ["vllm", "serve"]
    assert "--enable-sleep-mode" in container["args"]
    assert {"name": "VLLM_SERVER_DEV_MODE", "value": "1"} in container["env"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert {"containerPort": 8000}.items() <= container["ports"][0].items()
    labels = pod["metadata"]["labels"]
    engine_selector = values()["networkPolicy"]["enginePodSelector"]["matchLabels"]
    assert engine_selector.items() <= labels.items()
    selectors = [models.parse_spec(doc["spec"]).selector for _path, doc in INFERENCE_MODELS]
    assert any(selector.matches(labels) for selector in selectors)
    services = [
        doc
        for path in sorted(EXAMPLES.glob("*.yaml"))
        for doc in _documents(path)
        if doc.get("kind") == "Service"
    ]
    assert any(service["spec"]["selector"].items() <= labels.items() for service in services)


def test_chart_yaml() -> None:
    chart = load_yaml(CHART / "Chart.yaml")
    assert chart["apiVersion"] == "v2" and chart["name"] == "snooze"
    assert chart["version"] and chart["appVersion"]


def test_artifact_hub_lists_every_crd_of_snooze() -> None:
    """Artifact Hub shows the CRDs the annotation lists: both of Snooze's (kopf's peering CRDs,
    shipped beside them, are kopf's own)."""
    chart = load_yaml(CHART / "Chart.yaml")
    listed = {c["name"]: c for c in yaml.safe_load(chart["annotations"]["artifacthub.io/crds"])}
    shipped = {
        doc["metadata"]["name"]: doc
        for path in sorted((CHART / "crds").glob("*.yaml"))
        for doc in _documents(path)
        if doc["spec"]["group"] == "snooze.dev"
    }
    assert set(listed) == set(shipped)
    for name, crd in shipped.items():
        assert listed[name]["kind"] == crd["spec"]["names"]["kind"]
        assert listed[name]["version"] == crd["spec"]["versions"][0]["name"]


FILES_GET = re.compile(r'\.Files\.Get "([^"]+)"')


def test_files_the_templates_read_exist() -> None:
    read = {m for path in TEMPLATES.iterdir() for m in FILES_GET.findall(path.read_text())}
    assert read == {"dashboards/snooze.json", "rules/snooze.rules.yaml"}
    dashboard = json.loads((CHART / "dashboards" / "snooze.json").read_text())
    assert dashboard["title"] and isinstance(dashboard.get("panels"), list)


def test_alert_rules_file_is_a_prometheus_rules_file() -> None:
    path = CHART / "rules" / "snooze.rules.yaml"
    rules = load_yaml(path)
    assert set(rules) == {"groups"}, "a plain Prometheus rules file: only `groups:`"
    for group in rules["groups"]:
        assert group["name"] and group["rules"]


def _parser(module: str) -> argparse.ArgumentParser:
    import importlib

    parser = argparse.ArgumentParser()
    importlib.import_module(module).add_arguments(parser)
    return parser


@pytest.mark.parametrize(
    ("command", "module"),
    [("operator", "snooze.operator.cli"), ("gateway", "snooze.gateway.cli")],
)
def test_template_flags_are_the_commands_flags(command: str, module: str) -> None:
    text = (TEMPLATES / f"{command}-deployment.yaml").read_text()
    assert re.search(rf"args:\n\s+- {command}\n", text)
    used = set(re.findall(r"^\s+- (--[a-z-]+)=", text, re.M))
    known = {flag for action in _parser(module)._actions for flag in action.option_strings}
    assert not used - known, f"`snooze {command}` has no {sorted(used - known)}"


# Durations in the values, as the specs write them.
DURATIONS = {"operator": {"probeInterval": "1m30s", "drainTimeout": "500ms"}}


@pytest.mark.parametrize("name", [*sorted(VALUE_SETS), "durations"])
def test_the_rendered_arguments_are_ones_the_commands_take(name: str) -> None:
    """Each Deployment's arguments, as its container would run them: the command line parses
    and the settings are made (a value the schema takes but the command refuses would leave the
    pod crash-looping)."""
    from snooze.cli import build_parser
    from snooze.gateway.cli import settings_from as gateway_settings
    from snooze.operator.cli import settings_from as operator_settings

    rendering = render(DURATIONS if name == "durations" else VALUE_SETS[name])
    made: dict[str, Any] = {}
    for deployment in rendering.of_kind("Deployment"):
        [container] = deployment["spec"]["template"]["spec"]["containers"]
        args = build_parser().parse_args(container["args"])
        made[args.command] = {"operator": operator_settings, "gateway": gateway_settings}[
            args.command
        ](args)
    assert set(made) == {"operator", "gateway"}
    if name == "durations":
        assert (made["operator"].probe_interval, made["operator"].drain_timeout) == (90, 0.5)
