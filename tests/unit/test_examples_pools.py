"""The GPU pool examples (examples/pools/): Kubernetes 1.34 accepts their built-in kinds, the CRDs
and the models accept their GPUPools and InferenceModels, their pods are members of their pool
by the operator's own rule, and their arithmetic holds: every member fits awake beside the
others asleep, any two fit awake at once, never all. Each check is also run on broken copies,
to show that it catches what it is for."""

from __future__ import annotations

import copy
import itertools
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from manifests import validate_strict

from snooze.api import agreed, gpupool, models
from snooze.api.gpupool import GPUPoolSpec
from snooze.api.models import InferenceModelSpec
from snooze.api.quantities import GIB, format_gib, parse_quantity
from snooze.kube.pods import pod_info, pool_name_of
from snooze.policy.pool.decision import (
    Member,
    MemberState,
    PoolView,
    WakeAsk,
    decide_pool,
    overcommitted,
)

ROOT = Path(__file__).resolve().parents[2]
POOLS = ROOT / "examples" / "pools"
FILES = sorted(POOLS.rglob("*.yaml"))
WAYS = {"dra": POOLS / "dra", "time-slicing": POOLS / "time-slicing"}
KUBERNETES = "1.34.0"
SNOOZE_KINDS = {models.KIND, gpupool.KIND}
NVIDIA_DRA_DEVICE_CLASS = "gpu.nvidia.com"  # NVIDIA's DRA driver for GPUs names its class so
SLACK = GIB  # a declared footprint above the engine's share of the pool wastes room beyond this
Doc = dict[str, Any]


def documents(path: Path) -> list[Doc]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def way(name: str) -> list[Doc]:
    return [doc for path in sorted(WAYS[name].glob("*.yaml")) for doc in documents(path)]


def of_kind(docs: list[Doc], kind: str) -> list[Doc]:
    return [doc for doc in docs if doc.get("kind") == kind]


def test_the_two_ways_and_nothing_unchecked() -> None:
    assert sorted(p.name for p in POOLS.iterdir()) == sorted(WAYS)
    assert {path.parent for path in FILES} == set(WAYS.values())


# -- Kubernetes 1.34, the CRDs and the models ------------------------------------------------


def test_built_in_kinds_pass_kubernetes_validate_strict() -> None:
    output = validate_strict(FILES, KUBERNETES)
    unknown = re.findall(r"Couldn't find schema for kind (\S+) with api version (\S+)", output)
    assert {kind for kind, _ in unknown} <= SNOOZE_KINDS, output
    passed = re.findall(
        r"^INFO (\S+) passed for resource (\S+) against version 1\.34$", output, re.M
    )
    built_in = [
        (str(path), f"{doc['kind'].lower()}/{doc['metadata']['name']}")
        for path in FILES
        for doc in documents(path)
        if doc["kind"] not in SNOOZE_KINDS
    ]
    assert sorted(passed) == sorted(built_in), output
    kinds = {doc["kind"] for path in FILES for doc in documents(path)}
    assert {"ResourceClaim", "ConfigMap", "Deployment"} <= kinds


def closed(schema: Doc) -> Doc:
    """A CRD's schema as the API server applies it under kubectl's default strict field
    validation: an unknown field anywhere under spec is refused, not pruned."""
    schema = copy.deepcopy(schema)

    def close(node: Any) -> None:
        if isinstance(node, dict):
            if "properties" in node:
                node["additionalProperties"] = False
            for value in node.values():
                close(value)
        elif isinstance(node, list):
            for item in node:
                close(item)

    close(schema["properties"]["spec"])
    return schema


def crd_schema(kind: str) -> Doc:
    """The openAPIV3Schema of the CRD in crds/ (what `kubectl apply -f crds/` installs)."""
    for path in sorted((ROOT / "crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        if crd["spec"]["names"]["kind"] == kind:
            return closed(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    raise AssertionError(f"no CRD for {kind} in crds/")


SNOOZE_DOCS = [
    pytest.param(doc, id=f"{path.parent.name}/{path.name}:{doc['kind']}")
    for path in FILES
    for doc in documents(path)
    if doc["kind"] in SNOOZE_KINDS
]


@pytest.mark.parametrize("doc", SNOOZE_DOCS)
def test_snooze_kinds_pass_the_crd_schema_and_the_models(doc: Doc) -> None:
    assert doc["apiVersion"] == models.API_VERSION
    jsonschema.validate(doc, crd_schema(doc["kind"]))
    parse = models.parse_spec if doc["kind"] == models.KIND else gpupool.parse_pool_spec
    parse(doc["spec"])
    assert "namespace" not in doc["metadata"], "a pool and its members share one namespace"


def test_a_misspelt_field_is_refused_by_the_schema_and_the_models() -> None:
    [pool] = of_kind(way("dra"), gpupool.KIND)
    typo = copy.deepcopy(pool)
    typo["spec"]["minResidence"] = typo["spec"].pop("minResidency")
    with pytest.raises(jsonschema.ValidationError, match="minResidence"):
        jsonschema.validate(typo, crd_schema(gpupool.KIND))
    with pytest.raises(models.SpecError, match=r"spec\.minResidence: unknown field"):
        gpupool.parse_pool_spec(typo["spec"])


# -- One way of sharing a GPU, checked as the operator would see it ---------------------------


def model_specs(docs: list[Doc]) -> dict[str, InferenceModelSpec]:
    return {d["metadata"]["name"]: models.parse_spec(d["spec"]) for d in of_kind(docs, models.KIND)}


def member_of(deployment: Doc, specs: dict[str, InferenceModelSpec]) -> tuple[str, Any]:
    """The InferenceModel that selects the Deployment's pods, and the pod it makes."""
    template = deployment["spec"]["template"]
    pod = pod_info({"metadata": {**template["metadata"], "name": "p"}, "spec": template["spec"]})
    owners = [name for name, spec in specs.items() if spec.selector.matches(pod.labels)]
    return (owners[0] if len(owners) == 1 else ""), pod


def engine_problems(deployment: Doc, model: str, spec: InferenceModelSpec) -> list[str]:
    """What keeps a Deployment's vLLM from sleeping and sharing: `vllm serve MODEL
    --enable-sleep-mode --gpu-memory-utilization SHARE`, dev mode on, a readiness probe."""
    name = deployment["metadata"]["name"]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    words = [*container.get("command", []), *container.get("args", [])]
    problems = []
    if words[:3] != ["vllm", "serve", spec.model_name]:
        problems.append(f"{name}: runs {words[:3]}, not vllm serve {spec.model_name} ({model})")
    if "--enable-sleep-mode" not in words:
        problems.append(f"{name}: no --enable-sleep-mode")
    if {"name": "VLLM_SERVER_DEV_MODE", "value": "1"} not in container.get("env", []):
        problems.append(f"{name}: no VLLM_SERVER_DEV_MODE=1 (the sleep endpoints are 404)")
    probe = container.get("readinessProbe", {}).get("httpGet", {})
    if probe.get("path") != "/health":
        problems.append(f"{name}: no readiness probe on /health")
    ports = {p["containerPort"] for p in container.get("ports", [])}
    if spec.engine.port not in ports:
        problems.append(f"{name}: {model} reaches port {spec.engine.port}, the pod has {ports}")
    return problems


def pool_problems(docs: list[Doc]) -> list[str]:
    """Everything wrong with one way of sharing a GPU: members that are not members, engines
    that cannot sleep or share, footprints that disagree with the shares, and arithmetic in
    which a member cannot wake, two cannot be awake at once, or all can (no pool needed)."""
    [pool_doc] = of_kind(docs, gpupool.KIND)
    pool_name = pool_doc["metadata"]["name"]
    pool = gpupool.parse_pool_spec(pool_doc["spec"])
    claims = {pool.resource_claim_name: pool_name} if pool.resource_claim_name else {}
    specs = model_specs(docs)
    problems: list[str] = []
    members: list[Member] = []
    served = set()
    for deployment in of_kind(docs, "Deployment"):
        name = deployment["metadata"]["name"]
        model, pod = member_of(deployment, specs)
        if not model:
            problems.append(f"{name}: its pods are not selected by exactly one InferenceModel")
            continue
        served.add(model)
        spec = specs[model]
        problems += engine_problems(deployment, model, spec)
        found = pool_name_of(pod, spec, claims)
        if found != pool_name:
            problems.append(f"{name}: its pods are members of pool {found}, not {pool_name}")
        if spec.pool is None or spec.pool.name != pool_name:
            problems.append(f"{model}: spec.pool.name is not {pool_name}")
            continue
        share = pod.gpu_memory_utilization
        if share is None:
            problems.append(f"{name}: no --gpu-memory-utilization: it would take 0.92 of the GPU")
            continue
        # The coordinator's rule: spec.pool.memory, else the share of the pool's memory.
        takes = int(share * pool.memory_bytes)
        footprint = spec.pool.memory_bytes or takes
        if footprint < takes:
            problems.append(
                f"{model}: spec.pool.memory {spec.pool.memory} is less than its share "
                f"{share} x {pool.memory} = {format_gib(takes)}: the pool would count it short"
            )
        if footprint > takes + SLACK:
            problems.append(
                f"{model}: spec.pool.memory {spec.pool.memory} is far above its share {share} x "
                f"{pool.memory} = {format_gib(takes)}: --gpu-memory-utilization and memory differ"
            )
        residue = spec.pool.asleep_bytes
        for replica in range(int(deployment["spec"].get("replicas", 1))):
            members.append(
                Member(
                    pod=f"{name}-{replica}",
                    model=model,
                    state=MemberState.ASLEEP,
                    footprint=footprint,
                    residue=residue,
                    priority=spec.pool.priority,
                )
            )
    problems += [f"{model}: no Deployment serves it" for model in sorted(set(specs) - served)]
    return problems + arithmetic_problems(pool, members)


def awake_at_once(pool: GPUPoolSpec, members: list[Member]) -> list[int]:
    """How many members the pool lets wake at once from all asleep, for every order in which
    they ask: the real decision, first come first served."""
    counts = []
    for order in itertools.permutations(members):
        view = PoolView(
            memory=pool.memory_bytes,
            host_memory=pool.host_memory_bytes,
            eviction=pool.eviction,
            min_residency=pool.min_residency_seconds,
            members=members,
            asks=[WakeAsk(pod=m.pod, asked_at=float(i)) for i, m in enumerate(order)],
        )
        counts.append(len(decide_pool(view).grant))
    return counts


def arithmetic_problems(pool: GPUPoolSpec, members: list[Member]) -> list[str]:
    if len(members) < 3:
        return [f"{len(members)} members: a pool example shares a GPU between more than two"]
    problems = []
    if (why := overcommitted(pool.memory_bytes, members)) is not None:
        problems.append(f"overcommitted: {why}")
    counts = awake_at_once(pool, members)
    if min(counts) < 2:
        problems.append(f"fewer than two members fit awake at once ({min(counts)}, some orders)")
    if max(counts) == len(members):
        problems.append(f"all {len(members)} members fit awake at once: nothing to share")
    return problems


def dra_problems(docs: list[Doc]) -> list[str]:
    """The DRA wiring: one ResourceClaim for one NVIDIA GPU with at least the pool's memory,
    named by the GPUPool and referenced (and used by the container) in every member pod."""
    [pool_doc] = of_kind(docs, gpupool.KIND)
    pool = gpupool.parse_pool_spec(pool_doc["spec"])
    claims = of_kind(docs, "ResourceClaim")
    if [c["metadata"]["name"] for c in claims] != [pool.resource_claim_name]:
        return [f"the GPUPool names claim {pool.resource_claim_name}; the files hold {claims}"]
    [request] = claims[0]["spec"]["devices"]["requests"]
    exactly = request.get("exactly", {})
    problems = []
    if exactly.get("deviceClassName") != NVIDIA_DRA_DEVICE_CLASS:
        problems.append(f"the claim asks class {exactly.get('deviceClassName')}")
    if exactly.get("count", 1) != 1 or exactly.get("allocationMode", "ExactCount") != "ExactCount":
        problems.append("the claim asks for other than exactly one device")
    floors = [
        parse_quantity(q)
        for s in exactly.get("selectors", [])
        for q in re.findall(r"quantity\('([^']+)'\)", s["cel"]["expression"])
    ]
    if not floors or max(floors) < pool.memory_bytes:
        problems.append(f"the claim may get a device with less than the pool's {pool.memory}")
    for deployment in of_kind(docs, "Deployment"):
        name = deployment["metadata"]["name"]
        spec = deployment["spec"]["template"]["spec"]
        entries = [
            e["name"]
            for e in spec.get("resourceClaims", [])
            if e.get("resourceClaimName") == pool.resource_claim_name
        ]
        for container in spec["containers"]:
            used = {c["name"] for c in container.get("resources", {}).get("claims", [])}
            if not used & set(entries):
                problems.append(f"{name}: container {container['name']} uses no shared claim")
            if "nvidia.com/gpu" in str(container.get("resources")):
                problems.append(f"{name}: asks the device plugin for a GPU of its own too")
    return problems


def time_slicing_problems(docs: list[Doc]) -> list[str]:
    """The time-slicing wiring: every member on one node, whose device plugin configuration
    (named by a node label the pods select) slices nvidia.com/gpu at least once per member,
    every member asking for one slice; other nodes keep a configuration without sharing."""
    [config_map] = of_kind(docs, "ConfigMap")
    deployments = of_kind(docs, "Deployment")
    selectors = [d["spec"]["template"]["spec"].get("nodeSelector", {}) for d in deployments]
    problems = []
    hosts = {s.get("kubernetes.io/hostname") for s in selectors}
    if len(hosts) != 1 or None in hosts:
        problems.append(f"the members are not pinned to one node: {hosts}")
    configs = {s.get("nvidia.com/device-plugin.config") for s in selectors}
    if len(configs) != 1 or None in configs or not configs <= set(config_map["data"]):
        return [*problems, f"the members select device plugin configurations {configs}"]
    if "default" not in config_map["data"]:
        problems.append("no default configuration: every node would be time-sliced")
    [name] = configs
    sharing = yaml.safe_load(config_map["data"][name]).get("sharing", {}).get("timeSlicing", {})
    if sharing.get("renameByDefault"):
        problems.append("renameByDefault: the slices are nvidia.com/gpu.shared")
    replicas = {r["name"]: r["replicas"] for r in sharing.get("resources", [])}
    slices = sum(int(d["spec"].get("replicas", 1)) for d in deployments)
    if replicas.get("nvidia.com/gpu", 0) < slices:
        problems.append(f"{replicas.get('nvidia.com/gpu')} time-slices for {slices} members")
    [pool] = of_kind(docs, gpupool.KIND)
    for deployment in deployments:
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        if labels.get(agreed.POOL_LABEL) != pool["metadata"]["name"]:
            problems.append(f"{deployment['metadata']['name']}: no {agreed.POOL_LABEL} label")
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            limits = container.get("resources", {}).get("limits", {})
            if str(limits.get("nvidia.com/gpu")) != "1":
                problems.append(f"{deployment['metadata']['name']}: does not ask for one slice")
    return problems


WIRING: dict[str, Callable[[list[Doc]], list[str]]] = {
    "dra": dra_problems,
    "time-slicing": time_slicing_problems,
}


@pytest.mark.parametrize("name", sorted(WAYS))
def test_each_way_is_a_working_pool(name: str) -> None:
    docs = way(name)
    assert pool_problems(docs) + WIRING[name](docs) == []
    assert len(of_kind(docs, "Deployment")) == 4


ROW = re.compile(r"^#\s+(\S+)\s+--gpu-memory-utilization ([0-9.]+)\s+(?:spec\.pool\.memory )?(\S+)")
SUM = re.compile(r"^#\s+(\w+) awake, (\w+) asleep:\s+([0-9. +]+) = ([0-9.]+)Gi (<=|>) ([0-9.]+)Gi")


@pytest.mark.parametrize("name", sorted(WAYS))
def test_the_comments_arithmetic_is_the_files(name: str) -> None:
    """pool.yaml's table and sums say what the files hold: each model's share and awake
    footprint, and how many fit awake."""
    docs = way(name)
    [pool_doc] = of_kind(docs, gpupool.KIND)
    pool = gpupool.parse_pool_spec(pool_doc["spec"])
    comments = (WAYS[name] / "pool.yaml").read_text().splitlines()
    rows = {m[1]: (m[2], m[3]) for line in comments if (m := ROW.match(line))}
    specs = model_specs(docs)
    assert sorted(rows) == sorted(specs)
    footprints = []
    for deployment in of_kind(docs, "Deployment"):
        model, pod = member_of(deployment, specs)
        share, awake = rows[model]
        assert pod.gpu_memory_utilization == float(share), model
        spec_pool = specs[model].pool
        assert spec_pool is not None
        footprint = spec_pool.memory_bytes or int(float(share) * pool.memory_bytes)
        assert parse_quantity(awake) == pytest.approx(footprint, abs=0.01 * GIB), model
        footprints.append(footprint / GIB)
        assert spec_pool.asleep_bytes == 2 * GIB
    sums = [m.groups() for line in comments if (m := SUM.match(line))]
    assert [(a, b) for a, b, *_ in sums] == [("two", "two"), ("three", "one")]
    for _, _, terms, total, compare, memory in sums:
        assert sum(map(float, terms.split("+"))) == pytest.approx(float(total), abs=0.05)
        assert (float(total) <= float(memory)) == (compare == "<=")
        assert parse_quantity(f"{memory}Gi") == pool.memory_bytes
    (_, _, two, *_), (_, _, three, *_) = sums
    biggest_two = sorted(footprints)[-2:]
    smallest_three = sorted(footprints)[:3]
    assert sorted(map(float, two.split("+")))[-2:] == pytest.approx(biggest_two, abs=0.01)
    assert sorted(map(float, three.split("+")))[-3:] == pytest.approx(smallest_three, abs=0.01)


# -- Broken copies: each check catches what it is for ----------------------------------------


def _containers(docs: list[Doc], deployment: str) -> Doc:
    [d] = [d for d in of_kind(docs, "Deployment") if d["metadata"]["name"] == deployment]
    container: Doc = d["spec"]["template"]["spec"]["containers"][0]
    return container


def _set_share(docs: list[Doc], deployment: str, share: str) -> None:
    args = _containers(docs, deployment)["args"]
    args[args.index("--gpu-memory-utilization") + 1] = share


def _set_all_shares(docs: list[Doc], share: str, memory: str | None) -> None:
    for d in of_kind(docs, "Deployment"):
        _set_share(docs, d["metadata"]["name"], share)
    for m in of_kind(docs, models.KIND):
        m["spec"]["pool"].pop("memory", None)
        if memory:
            m["spec"]["pool"]["memory"] = memory


def _deployment(docs: list[Doc], name: str) -> Doc:
    [d] = [d for d in of_kind(docs, "Deployment") if d["metadata"]["name"] == name]
    return d


def _model(docs: list[Doc], name: str) -> Doc:
    [m] = [m for m in of_kind(docs, models.KIND) if m["metadata"]["name"] == name]
    return m


def _break_slices(docs: list[Doc]) -> None:
    [config_map] = of_kind(docs, "ConfigMap")
    config_map["data"]["time-sliced-4"] = config_map["data"]["time-sliced-4"].replace(
        "replicas: 4", "replicas: 3"
    )


BROKEN: list[tuple[str, str, Callable[[list[Doc]], None], str]] = [
    ("dra", "share above the declared memory",
     lambda d: _set_share(d, "qwen3-8b", "0.55"), "spec.pool.memory 36Gi is less than its share"),
    ("dra", "declared memory far above the share",
     lambda d: _set_share(d, "qwen3-8b", "0.30"), "is far above its share"),
    ("dra", "only one fits",
     lambda d: _set_all_shares(d, "0.6", "48Gi"), "fewer than two members fit awake"),
    ("time-slicing", "all fit",
     lambda d: _set_all_shares(d, "0.2", None), "all 4 members fit awake at once"),
    ("time-slicing", "one alone does not fit",
     lambda d: _set_all_shares(d, "0.99", None), "overcommitted"),
    ("dra", "no claim reference",
     lambda d: _deployment(d, "granite-3-3-8b")["spec"]["template"]["spec"].pop("resourceClaims"),
     "granite-3-3-8b: container vllm uses no shared claim"),
    ("dra", "claim unused by the container",
     lambda d: _containers(d, "granite-3-3-8b")["resources"].pop("claims"),
     "uses no shared claim"),
    ("dra", "another device class",
     lambda d: of_kind(d, "ResourceClaim")[0]["spec"]["devices"]["requests"][0]["exactly"]
     .update(deviceClassName="gpu.example.com"), "the claim asks class gpu.example.com"),
    ("time-slicing", "no pool label",
     lambda d: _deployment(d, "qwen3-8b")["spec"]["template"]["metadata"]["labels"]
     .pop("snooze.dev/pool"), "qwen3-8b: no snooze.dev/pool label"),
    ("time-slicing", "the model names another pool",
     lambda d: _model(d, "qwen3-8b")["spec"]["pool"].update(name="gpu-node-2"),
     "qwen3-8b: spec.pool.name is not gpu-node-1"),
    ("dra", "the model names another pool, its pods the claim",
     lambda d: _model(d, "qwen3-8b")["spec"]["pool"].update(name="other"),
     "qwen3-8b: spec.pool.name is not shared-h100"),
    ("time-slicing", "a label for another pool",
     lambda d: _deployment(d, "qwen3-8b")["spec"]["template"]["metadata"]["labels"]
     .update({"snooze.dev/pool": "gpu-node-2"}),
     "qwen3-8b: its pods are members of pool gpu-node-2, not gpu-node-1"),
    ("time-slicing", "another node",
     lambda d: _deployment(d, "qwen3-8b")["spec"]["template"]["spec"]["nodeSelector"]
     .update({"kubernetes.io/hostname": "gpu-node-2"}), "not pinned to one node"),
    ("time-slicing", "fewer slices than members", _break_slices, "3 time-slices for 4 members"),
    ("time-slicing", "no sleep mode",
     lambda d: _containers(d, "qwen3-8b")["args"].remove("--enable-sleep-mode"),
     "qwen3-8b: no --enable-sleep-mode"),
    ("time-slicing", "no dev mode",
     lambda d: _containers(d, "qwen3-8b").pop("env"), "no VLLM_SERVER_DEV_MODE=1"),
    ("dra", "no share",
     lambda d: _containers(d, "qwen3-8b").update(args=["Qwen/Qwen3-8B", "--enable-sleep-mode"]),
     "no --gpu-memory-utilization"),
    ("dra", "another model served",
     lambda d: _containers(d, "qwen3-8b")["args"].__setitem__(0, "Qwen/Qwen3-14B"),
     "not vllm serve Qwen/Qwen3-8B"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "case", "breaks", "problem"), BROKEN, ids=[f"{b[0]}: {b[1]}" for b in BROKEN]
)
def test_a_broken_copy_is_caught(
    name: str, case: str, breaks: Callable[[list[Doc]], None], problem: str
) -> None:
    docs = copy.deepcopy(way(name))
    breaks(docs)
    found = pool_problems(docs) + WIRING[name](docs)
    assert any(problem in p for p in found), f"{case}: {found}"


def test_an_unscheduled_pod_is_no_member() -> None:
    # A Pending pod no node took (a fifth replica on a node sliced four ways) holds nothing
    # on the device: it must not make the pool put an awake member to sleep for it.
    from snooze.kube.pods import pod_info

    pending = pod_info(
        {
            "metadata": {"name": "q-2", "labels": {"snooze.dev/pool": "p"}},
            "spec": {"containers": [{"name": "v", "image": "i"}]},
            "status": {"phase": "Pending"},
        }
    )
    bound = pod_info(
        {
            "metadata": {"name": "q-3"},
            "spec": {"nodeName": "gpu-node-1", "containers": [{"name": "v", "image": "i"}]},
            "status": {"phase": "Pending"},
        }
    )
    assert not pending.scheduled and bound.scheduled
