"""The manifests of docs/inference-gateway.md (examples/inference-gateway/): Kubernetes 1.34
accepts their built-in kinds strictly; Snooze's CRD and models accept the InferenceModel; the
Inference Extension's own CRD, from its Go module at release v1.5.0 (downloaded by the test, never
kept in this tree), accepts the InferencePool; the picker's configuration and flags are ones that
release reads, with flow control on and a TTL longer than a wake and a cold start; the pieces
name each other; and the page shows the examples as they are."""

from __future__ import annotations

import json
import re
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import docs_pages
import jsonschema
import pytest
import yaml
from manifests import validate_strict

from snooze.api.agreed import AWAKE_CONDITION
from snooze.api.durations import parse_duration
from snooze.api.models import parse_spec
from snooze.kube.inferencepools import METRICS_PORT_NAME, read_pool
from snooze.policy.pickers import pools_serving, selects

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "inference-gateway"
FILES = sorted(EXAMPLE.glob("*.yaml"))
PAGE = "docs/inference-gateway.md"
MODULE = "sigs.k8s.io/gateway-api-inference-extension"
RELEASE = "v1.5.0"
KUBERNETES = "1.34.0"
CUSTOM_KINDS = {"InferenceModel", "InferencePool"}
Doc = dict[str, Any]


def documents() -> list[Doc]:
    return [doc for path in FILES for doc in yaml.safe_load_all(path.read_text()) if doc]


def one(kind: str, name: str | None = None) -> Doc:
    [found] = [
        d
        for d in documents()
        if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
    return found


@cache
def module() -> Path:
    """The Inference Extension's module at RELEASE, as the Go module proxy serves it."""
    answer = subprocess.run(
        ["go", "mod", "download", "-json", f"{MODULE}@{RELEASE}"],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT / "tests",
    )
    assert answer.returncode == 0, answer.stdout + answer.stderr
    return Path(json.loads(answer.stdout)["Dir"])


def go_sources(*parts: str) -> str:
    base = module().joinpath(*parts)
    return "\n".join(p.read_text() for p in sorted(base.rglob("*.go")) if "_test" not in p.name)


def test_the_files_are_the_three_the_page_names() -> None:
    assert [p.name for p in FILES] == ["inferencepool.yaml", "picker.yaml", "qwen3-8b.yaml"]
    assert {d["kind"] for d in documents()} >= {
        "InferencePool",
        "InferenceModel",
        "Deployment",
        "ConfigMap",
        "Service",
    }


def test_built_in_kinds_pass_kubernetes_validate_strict() -> None:
    output = validate_strict(FILES, KUBERNETES)
    unknown = re.findall(r"Couldn't find schema for kind (\S+) with api version", output)
    assert set(unknown) == CUSTOM_KINDS, output
    passed = re.findall(r"^INFO \S+ passed for resource (\S+) against version", output, re.M)
    built_in = [d for d in documents() if d["kind"] not in CUSTOM_KINDS]
    assert len(passed) == len(built_in), output


def test_the_inference_model_is_valid_for_snoozes_crd() -> None:
    model = one("InferenceModel")
    crd = yaml.safe_load((ROOT / "crds" / "inferencemodels.snooze.dev.yaml").read_text())
    [version] = crd["spec"]["versions"]
    jsonschema.validate(model, version["schema"]["openAPIV3Schema"])
    parse_spec(model["spec"])


@pytest.mark.needs("go")
def test_the_pool_is_valid_for_the_inference_extensions_own_crd() -> None:
    path = module() / "config" / "crd" / "bases" / "inference.networking.k8s.io_inferencepools.yaml"
    crd = yaml.safe_load(path.read_text())
    [v1] = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    pool = one("InferencePool")
    jsonschema.validate(pool, v1["schema"]["openAPIV3Schema"])
    with pytest.raises(jsonschema.ValidationError):  # the schema does refuse what is wrong
        jsonschema.validate(
            {**pool, "spec": {**pool["spec"], "selector": {}}}, v1["schema"]["openAPIV3Schema"]
        )
    assert not read_pool(pool).problem


def picker_config() -> Doc:
    config: Doc = yaml.safe_load(one("ConfigMap", "qwen3-8b-epp")["data"]["config.yaml"])
    return config


@pytest.mark.needs("go")
def test_the_picker_configuration_is_one_the_release_reads() -> None:
    config = picker_config()
    types = go_sources("apix", "config", "v1alpha1")
    tags = set(re.findall(r'json:"(\w+)', types))
    for key in config:
        assert key in tags | {"apiVersion", "kind"}, key
    for key in config["flowControl"]:
        assert key in tags, key
    group = config["apiVersion"].split("/")[0]
    assert f'"{group}"' in types, f"{group} is not the group of EndpointPickerConfig"
    # Flow control is on: the feature gate by the name the release gives it.
    gate = re.search(r'FeatureGate = "(\w+)"', go_sources("pkg", "epp", "flowcontrol"))
    assert gate is not None and config["featureGates"] == [gate.group(1)]
    plugins = go_sources("pkg", "epp")
    for plugin in config["plugins"]:
        assert f'= "{plugin["type"]}"' in plugins, f"no plugin type {plugin['type']} in {RELEASE}"
    names = {p.get("name", p["type"]) for p in config["plugins"]}
    for profile in config["schedulingProfiles"]:
        assert {p["pluginRef"] for p in profile["plugins"]} <= names


def test_the_ttl_outlasts_a_wake_and_a_cold_start() -> None:
    ttl = parse_duration(picker_config()["flowControl"]["defaultRequestTTL"])
    spec = parse_spec(one("InferenceModel")["spec"])
    assert ttl > spec.wake_timeout_seconds
    assert spec.scale_to_zero_after is not None and ttl > spec.cold_start_timeout_seconds


@pytest.mark.needs("go")
def test_the_picker_runs_the_release_with_flags_it_has() -> None:
    [container] = one("Deployment", "qwen3-8b-epp")["spec"]["template"]["spec"]["containers"]
    assert container["image"].endswith(f"/epp:{RELEASE}")
    options = (module() / "pkg" / "epp" / "server" / "options.go").read_text()
    for arg in container["args"]:
        flag = arg.removeprefix("--").split("=")[0]
        assert f'"{flag}"' in options, f"{RELEASE}'s picker has no flag --{flag}"


def test_the_pieces_name_each_other() -> None:
    pool, model = one("InferencePool"), one("InferenceModel")
    engines, picker = one("Deployment", "qwen3-8b"), one("Deployment", "qwen3-8b-epp")
    service = one("Service", "qwen3-8b-epp")
    engine_labels = engines["spec"]["template"]["metadata"]["labels"]
    # The pool and the model select the same pods, which list Snooze's gate.
    seen = read_pool(pool)
    assert pools_serving([seen], [engine_labels]) == [seen]
    assert parse_spec(model["spec"]).selector.matches(engine_labels)
    template = engines["spec"]["template"]["spec"]
    assert template["readinessGates"] == [{"conditionType": AWAKE_CONDITION}]
    assert model["spec"]["modelName"] == template["containers"][0]["args"][0]
    assert model["spec"]["scaleTargetRef"]["name"] == engines["metadata"]["name"]
    # The pool names the picker's Service, on its ext_proc port; the Service has the port
    # Snooze reads, on the picker's metrics port, and selects the picker's pods.
    assert seen.picker == service["metadata"]["name"]
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert ports["grpc-ext-proc"]["port"] == pool["spec"]["endpointPickerRef"]["port"]["number"]
    [container] = picker["spec"]["template"]["spec"]["containers"]
    container_ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    metrics = ports[METRICS_PORT_NAME]
    assert metrics.get("targetPort", metrics["port"]) == container_ports["metrics"] == 9090
    assert selects(service["spec"]["selector"], picker["spec"]["template"]["metadata"]["labels"])
    assert f"--pool-name={pool['metadata']['name']}" in container["args"]
    [volume] = picker["spec"]["template"]["spec"]["volumes"]
    assert volume["configMap"]["name"] == one("ConfigMap")["metadata"]["name"]
    assert "--config-file=/config/config.yaml" in container["args"]
    # The chart's default pickerPodSelector (inferencepool: Exists) selects them.
    assert "inferencepool" in picker["spec"]["template"]["metadata"]["labels"]


def test_the_page_shows_the_examples_as_they_are() -> None:
    text = docs_pages.read(PAGE)
    shown = [b.body for b in docs_pages.blocks(text) if b.lang == "yaml"]
    assert len(shown) == 4
    files = "\n".join(p.read_text() for p in FILES)
    for block in shown:
        assert block in files, f"{PAGE} shows YAML that is not in {EXAMPLE}:\n{block}"
