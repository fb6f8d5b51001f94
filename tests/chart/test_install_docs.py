"""Every `helm install` the READMEs print installs as printed (Helm's install action, client-side
dry run), and the one that turns on the NetworkPolicy fences off the example engines."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml
from chart_helpers import CHART, EXAMPLES, ROOT
from rendering import render_error

READMES = [ROOT / "README.md", CHART / "README.md"]


def commands(path: Path, program: str) -> list[list[str]]:
    """The commands of the file's ```sh blocks that start with `program`, continuation lines
    joined, as the shell splits them."""
    found = []
    for block in re.findall(r"```sh\n(.*?)```", path.read_text(), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words[:2] == program.split():
                found.append(words)
    return found


INSTALLS = [(path, words) for path in READMES for words in commands(path, "helm install")]


def install(words: list[str]) -> tuple[str, list[dict[str, Any]]]:
    """`helm install RELEASE CHART [-n NS] [--create-namespace] [--set K=V]...` through Helm's
    own install action (dry run, no cluster), from the repository's root: the namespace and
    the objects it would create."""
    release, chart = words[2], words[3]
    namespace, values = "default", {}
    rest = iter(words[4:])
    for word in rest:
        if word in ("-n", "--namespace"):
            namespace = next(rest)
        elif word == "--set":
            values = merge(values, helm.parse_set_string(next(rest)))
        else:
            assert word == "--create-namespace", f"an option this test does not know: {word}"
    with helm.Config(namespace=namespace, storage_driver="memory") as config:
        release_info = config.install(
            str(ROOT / chart), release, values, namespace=namespace, dry_run="client"
        )
    objects = [obj for obj in yaml.safe_load_all(release_info["manifest"]) if obj]
    return namespace, objects


def merge(base: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    """Successive --set flags, as Helm merges them."""
    result = dict(base)
    for key, value in more.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merge(result[key], value)
        else:
            result[key] = value
    return result


def test_the_readmes_print_helm_installs() -> None:
    assert {path for path, _ in INSTALLS} == set(READMES)
    assert any("networkPolicy.enabled=true" in words for _, words in INSTALLS)


@pytest.mark.parametrize(
    ("path", "words"), INSTALLS, ids=[path.relative_to(ROOT).as_posix() for path, _ in INSTALLS]
)
def test_each_documented_install_installs(path: Path, words: list[str]) -> None:
    namespace, objects = install(words)
    kinds = {obj["kind"] for obj in objects}
    assert {"Deployment", "Service", "ServiceAccount"} <= kinds
    for obj in objects:
        if obj["kind"] not in ("NetworkPolicy", "ConfigMap") and "namespace" in obj["metadata"]:
            assert obj["metadata"]["namespace"] == namespace, obj["metadata"]


def test_the_documented_openshift_install_leaves_the_uid_to_the_platform() -> None:
    [words] = [w for _, w in INSTALLS if "podSecurityContext.runAsUser=null" in w]
    _, objects = install(words)
    deployments = [obj for obj in objects if obj["kind"] == "Deployment"]
    assert len(deployments) == 2
    for deployment in deployments:
        context = deployment["spec"]["template"]["spec"]["securityContext"]
        assert "runAsUser" not in context and "runAsGroup" not in context
        assert context["runAsNonRoot"] is True


def example_engine() -> dict[str, Any]:
    [deployment] = [
        doc
        for doc in yaml.safe_load_all((EXAMPLES / "vllm-qwen3-8b.yaml").read_text())
        if doc["kind"] == "Deployment"
    ]
    return deployment


def test_the_documented_install_fences_off_the_example_engines() -> None:
    """The install that turns on the NetworkPolicy puts one where the example's vLLM pods run,
    selecting them, on their port, letting in only this release's operator and gateway."""
    [words] = [w for _, w in INSTALLS if "networkPolicy.enabled=true" in w]
    namespace, objects = install(words)
    engine = example_engine()
    pod_labels = engine["spec"]["template"]["metadata"]["labels"]
    [container] = engine["spec"]["template"]["spec"]["containers"]
    port = container["ports"][0]["containerPort"]
    policies = [
        obj
        for obj in objects
        if obj["kind"] == "NetworkPolicy"
        and obj["metadata"]["namespace"] == engine["metadata"]["namespace"]
    ]
    assert len(policies) == 1, f"no NetworkPolicy in {engine['metadata']['namespace']}"
    [policy] = policies
    selector = policy["spec"]["podSelector"]
    assert (
        set(selector) == {"matchLabels"} and selector["matchLabels"].items() <= pod_labels.items()
    )
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    [rule] = policy["spec"]["ingress"]
    assert [p["port"] for p in rule["ports"]] == [port]
    # Only the release's operator and gateway pods, in the release's namespace.
    deployments = {
        obj["metadata"]["labels"]["app.kubernetes.io/component"]: obj
        for obj in objects
        if obj["kind"] == "Deployment"
    }
    assert len(rule["from"]) == 2
    for peer, component in zip(rule["from"], ["operator", "gateway"], strict=True):
        assert peer["namespaceSelector"] == {
            "matchLabels": {"kubernetes.io/metadata.name": namespace}
        }
        labels = deployments[component]["spec"]["template"]["metadata"]["labels"]
        assert peer["podSelector"]["matchLabels"].items() <= labels.items()


def test_a_network_policy_without_engine_namespaces_is_refused() -> None:
    """Enabled with no namespace to put it in, the policy would sit in the release's namespace,
    where no engine runs, and protect nothing: the install says what to set instead."""
    message = render_error({"networkPolicy": {"enabled": True}})
    assert "networkPolicy.namespaces" in message and "snooze" in message
    assert "--set 'networkPolicy.namespaces={default}'" in message
