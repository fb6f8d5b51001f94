"""Every `helm install` the docs print installs as printed (Helm's install action, client-side
dry run), and the production one fences off the example engines and the metrics ports: who
reaches which port is judged as Kubernetes judges NetworkPolicies (network_policies.py). The
images they build are the ones they install: no container engine runs here, so each `docker
build` and `docker push` is checked against its Dockerfile and the install's values, not run."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import docs_pages
import helm_python as helm
import pytest
import yaml
from chart_helpers import EXAMPLES, ROOT
from network_policies import Pod, reaches
from rendering import render

PAGES = ["README.md", "docs/install.md", "charts/snooze/README.md", "docs/inference-gateway.md"]
READMES = [ROOT / page for page in PAGES]


def commands(path: Path, program: str) -> list[list[str]]:
    """The commands of the page's command blocks that start with `program`, as the shell
    splits them."""
    found = []
    for line in docs_pages.commands(path.read_text()):
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
        elif isinstance(value, list) and isinstance(result.get(key), list):
            result[key] = _merge_list(result[key], value)
        else:
            result[key] = value
    return result


def _merge_list(base: list[Any], more: list[Any]) -> list[Any]:
    """`--set a[1]=...` after `--set a[0]=...`: Helm sets the one element and keeps the others
    (the parser fills the indexes before it with None)."""
    result = list(base) + [None] * (len(more) - len(base))
    for i, value in enumerate(more):
        if value is None:
            continue
        if isinstance(value, dict) and isinstance(result[i], dict):
            result[i] = merge(result[i], value)
        else:
            result[i] = value
    return result


def test_the_readmes_print_helm_installs() -> None:
    assert {path for path, _ in INSTALLS} == set(READMES)
    assert any(production(words) for _, words in INSTALLS)


def production(words: list[str]) -> bool:
    """The install that names where the engines run and which Prometheus scrapes."""
    return any(w.startswith("networkPolicy.namespaces=") for w in words) and any(
        w.startswith("networkPolicy.scraper.") for w in words
    )


@pytest.mark.parametrize(
    ("path", "words"), INSTALLS, ids=[path.relative_to(ROOT).as_posix() for path, _ in INSTALLS]
)
def test_each_documented_install_installs(path: Path, words: list[str]) -> None:
    namespace, objects = install(words)
    kinds = {obj["kind"] for obj in objects}
    assert {"Deployment", "Service", "ServiceAccount"} <= kinds
    for obj in objects:
        elsewhere = ("NetworkPolicy", "ConfigMap", "Role", "RoleBinding", "KopfPeering")
        if obj["kind"] not in elsewhere and "namespace" in obj["metadata"]:
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


def pod_of(objects: list[dict[str, Any]], component: str, namespace: str) -> Pod:
    [deployment] = [
        obj
        for obj in objects
        if obj["kind"] == "Deployment"
        and obj["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]
    return Pod(namespace, deployment["spec"]["template"]["metadata"]["labels"])


PRODUCTION = [(path, words) for path, words in INSTALLS if production(words)]


@pytest.mark.parametrize(
    ("path", "words"), PRODUCTION, ids=[path.relative_to(ROOT).as_posix() for path, _ in PRODUCTION]
)
def test_the_documented_install_fences_off_the_engines_and_the_metrics_ports(
    path: Path, words: list[str]
) -> None:
    """The production install: the example's vLLM pods and the metrics ports are reachable by
    Snooze and the named Prometheus only, on their ports only; the gateway's API by anyone."""
    namespace, objects = install(words)
    policies = [obj for obj in objects if obj["kind"] == "NetworkPolicy"]
    values = ROOT / "charts" / "snooze" / "values.yaml"
    ports = yaml.safe_load(values.read_text())
    api, gateway_metrics = ports["gateway"]["port"], ports["gateway"]["metricsPort"]
    operator_metrics, liveness = ports["operator"]["metricsPort"], ports["operator"]["livenessPort"]

    deployment = example_engine()
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    engine_port = container["ports"][0]["containerPort"]
    engine = Pod(
        deployment["metadata"]["namespace"], deployment["spec"]["template"]["metadata"]["labels"]
    )
    operator, gateway = (pod_of(objects, c, namespace) for c in ("operator", "gateway"))
    [scraper_namespace] = [
        w.split("=", 1)[1] for w in words if w.startswith("networkPolicy.scraper.namespace=")
    ]
    prometheus = Pod(scraper_namespace, {"app.kubernetes.io/name": "prometheus"})
    tenant = Pod(engine.namespace, {"app": "curious"})
    # A tenant's pod that wears Prometheus' label, in its own namespace or Snooze's.
    impostors = [
        Pod(ns, {"app.kubernetes.io/name": "prometheus"}) for ns in (engine.namespace, namespace)
    ]

    def can(source: Pod, target: Pod, port: int) -> bool:
        return reaches(policies, source, target, port)

    assert can(operator, engine, engine_port) and can(gateway, engine, engine_port)
    assert can(prometheus, engine, engine_port)
    assert not can(prometheus, engine, engine_port + 1), "the scrape port only"
    assert can(operator, gateway, gateway_metrics) and can(prometheus, gateway, gateway_metrics)
    assert can(prometheus, operator, operator_metrics)
    for anyone in (tenant, prometheus, operator, *impostors):
        assert can(anyone, gateway, api)
    for outsider in (tenant, *impostors):
        assert not can(outsider, engine, engine_port)
        assert not can(outsider, gateway, gateway_metrics)
        assert not can(outsider, operator, operator_metrics)
    for anyone in (tenant, gateway, prometheus):
        assert not can(anyone, operator, liveness), "the kubelet's, from the node, alone"
    assert not can(gateway, operator, operator_metrics)


def test_the_install_behind_the_inference_gateway_lets_the_picker_reach_the_engines() -> None:
    """docs/inference-gateway.md's install: the operator reads the pickers (its flag and its
    token); the example's picker, which scrapes vLLM's metrics, and the gateway's proxies
    (labelled with their Gateway's name, as GEP-1762 asks), which send it the requests, reach
    the engines' port, where a tenant's pod and another Gateway's proxies still do not."""
    [words] = [w for p, w in INSTALLS if p == ROOT / "docs/inference-gateway.md"]
    namespace, objects = install(words)
    [operator] = [
        obj
        for obj in objects
        if obj["kind"] == "Deployment"
        and obj["metadata"]["labels"]["app.kubernetes.io/component"] == "operator"
    ]
    assert "--inference-gateway" in operator["spec"]["template"]["spec"]["containers"][0]["args"]
    assert any(
        o["kind"] == "Secret" and o["metadata"]["name"].endswith("-picker-token") for o in objects
    )
    policies = [obj for obj in objects if obj["kind"] == "NetworkPolicy"]
    example = EXAMPLES / "inference-gateway"
    [engines] = [
        doc
        for doc in yaml.safe_load_all((example / "qwen3-8b.yaml").read_text())
        if doc["kind"] == "Deployment"
    ]
    [picker] = [
        doc
        for doc in yaml.safe_load_all((example / "picker.yaml").read_text())
        if doc["kind"] == "Deployment"
    ]
    engine = Pod(
        engines["metadata"]["namespace"], engines["spec"]["template"]["metadata"]["labels"]
    )
    port = engines["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
    epp = Pod(picker["metadata"]["namespace"], picker["spec"]["template"]["metadata"]["labels"])
    assert reaches(policies, epp, engine, port)
    proxy = {"gateway.networking.k8s.io/gateway-name": "inference-gateway"}
    assert reaches(policies, Pod(engine.namespace, proxy), engine, port)
    other = {"gateway.networking.k8s.io/gateway-name": "another"}
    assert not reaches(policies, Pod(engine.namespace, other), engine, port)
    assert not reaches(policies, Pod(engine.namespace, {"app": "curious"}), engine, port)
    assert reaches(policies, pod_of(objects, "operator", namespace), engine, port)


def test_the_default_install_fences_the_metrics_ports_and_says_what_it_cannot_fence() -> None:
    """With no engine namespace and no Prometheus named, the metrics ports are the operator's
    alone, and the notes say that the engines are not fenced and nothing scrapes."""
    rendering = render()
    policies = rendering.of_kind("NetworkPolicy")
    assert {p["metadata"]["namespace"] for p in policies} == {"snooze"}
    gateway = pod_of(rendering.objects, "gateway", "snooze")
    operator = pod_of(rendering.objects, "operator", "snooze")
    prometheus = Pod("monitoring", {"app.kubernetes.io/name": "prometheus"})
    assert reaches(policies, operator, gateway, 9091)
    assert not reaches(policies, prometheus, gateway, 9091)
    assert not reaches(policies, prometheus, operator, 9090)
    assert reaches(policies, Pod("default", {}), gateway, 8080)
    assert "--set 'networkPolicy.namespaces={default}'" in rendering.notes
    assert "--set networkPolicy.scraper.namespace=monitoring" in rendering.notes


def docker(path: Path, verb: str) -> list[dict[str, Any]]:
    """The page's `docker build` (tag, Dockerfile, context, build args) or `docker push`
    (tag) commands."""
    found = []
    for words in commands(path, f"docker {verb}"):
        rest, parsed = iter(words[2:]), {"args": {}, "file": None, "positional": []}
        for word in rest:
            if word == "-t":
                parsed["tag"] = next(rest)
            elif word == "-f":
                parsed["file"] = next(rest)
            elif word == "--build-arg":
                key, _, value = next(rest).partition("=")
                parsed["args"][key] = value
            else:
                assert not word.startswith("-"), f"an option this test does not know: {word}"
                parsed["positional"].append(word)
        found.append(parsed)
    return found


# The install pages: each builds the image it installs. Other pages install the image these
# build (the Inference Gateway's sends its reader to the Install page for it).
BUILDING = ["README.md", "docs/install.md", "charts/snooze/README.md"]


@pytest.mark.parametrize("page", BUILDING)
def test_the_documented_images_are_built_from_their_dockerfiles_and_pushed(page: str) -> None:
    path = ROOT / page
    builds, pushes = docker(path, "build"), docker(path, "push")
    assert builds, f"{page} says how to build the images: the chart's defaults name none published"
    assert [b["tag"] for b in builds] == [p["positional"][0] for p in pushes]
    for build in builds:
        [context] = build["positional"]
        assert (ROOT / context).is_dir(), context
        dockerfile = ROOT / (build["file"] or f"{context}/Dockerfile")
        declared = re.findall(r"^ARG (\w+)", dockerfile.read_text(), re.M)
        assert set(build["args"]) <= set(declared), (dockerfile, build["args"])
    # The operator's image is the one the install sets, tag and repository.
    [operator] = [b for b in builds if b["file"] == "images/operator/Dockerfile"]
    assert operator["positional"] == ["."]  # its Dockerfile copies from the repository's root
    # The page's first install is the one after its build.
    install = next(words for p, words in INSTALLS if p == path)
    sets = dict(w.split("=", 1) for w in install if w.startswith("image."))
    assert operator["tag"] == f"{sets['image.repository']}:{sets['image.tag']}"
    # The patched vLLM image (where a page builds it): its tag names the release it patches,
    # one the patch is for.
    patched = [b for b in builds if b["positional"] == ["images/vllm"]]
    assert patched or page == "charts/snooze/README.md"
    for vllm in patched:
        release = vllm["args"]["VLLM_TAG"]
        assert vllm["tag"].endswith(f":{release}-snooze")
        major, minor, _ = (int(n) for n in release.lstrip("v").split("."))
        assert (0, 12) <= (major, minor) <= (0, 26), "the hybrid wake fix is for 0.12.0 to 0.26.x"
