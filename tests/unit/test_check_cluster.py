"""`snooze check`'s judgements of a cluster: its CRDs against those this Snooze generates, the
operator's Deployment, its leader under kopf peering, and its ServiceAccount's permissions
(check/clusterjudge.py), as pure tables."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from snooze.api import crd, rbac
from snooze.api.times import format_time
from snooze.check.clusterjudge import (
    CrdSeen,
    OperatorConfig,
    Review,
    api,
    crds,
    first_difference,
    leader,
    operator,
    operator_config,
    peers,
    permissions,
    reviews,
)
from snooze.check.report import Level

NOW = 1_800_000_000.0


def seen(kind: str, installed: dict[str, Any] | None = None, **changes: Any) -> CrdSeen:
    expected = crd.CRDS[kind]()
    return CrdSeen(
        name=expected["metadata"]["name"], expected=expected, installed=installed, **changes
    )


def as_served(kind: str) -> dict[str, Any]:
    """The CRD as an API server hands it back: what was applied, plus what the server adds."""
    body = copy.deepcopy(crd.CRDS[kind]())
    body["spec"]["conversion"] = {"strategy": "None"}
    body["metadata"]["uid"] = "u"
    body["status"] = {"conditions": [{"type": "Established", "status": "True"}]}
    return body


def test_crds_as_this_snooze_generates_them() -> None:
    found = crds([seen(kind, as_served(kind)) for kind in crd.CRDS])
    assert found.level is Level.OK, found


def test_a_missing_crd_fails_and_says_how_to_install_it() -> None:
    found = crds([seen("InferenceModel", missing=True), seen("GPUPool", as_served("GPUPool"))])
    assert found.level is Level.FAILURE
    assert "inferencemodels.snooze.dev is not installed" in found.message
    assert "kubectl apply -f crds/" in found.fix


def test_an_older_crd_is_a_warning_that_names_where_it_differs() -> None:
    older = as_served("InferenceModel")
    schema = older["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    del schema["properties"]["spec"]["properties"]["idle"]
    found = crds([seen("InferenceModel", older)])
    assert found.level is Level.WARNING
    assert "openAPIV3Schema.properties.spec.properties.idle" in found.message


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda v: v.update(name="v1beta9"), "has no version v1alpha1"),
        (lambda v: v.update(served=False), "does not serve v1alpha1"),
    ],
)
def test_a_crd_that_does_not_serve_our_version_fails(change: Any, words: str) -> None:
    body = as_served("GPUPool")
    change(body["spec"]["versions"][0])
    found = crds([seen("GPUPool", body)])
    assert found.level is Level.FAILURE and words in found.message


def test_a_crd_that_is_not_established_fails() -> None:
    body = as_served("GPUPool")
    body["status"]["conditions"][0].update(status="False", message="names conflict")
    found = crds([seen("GPUPool", body)])
    assert found.level is Level.FAILURE and "not established: names conflict" in found.message


def test_a_crd_that_cannot_be_read_is_not_compared() -> None:
    found = crds([seen("GPUPool", failure="403 forbidden")])
    assert found.level is Level.WARNING and "403 forbidden" in found.message


@pytest.mark.parametrize(
    ("want", "have", "where"),
    [
        ({"a": 1}, {"a": 1}, None),
        ({"a": {"b": [1, 2]}}, {"a": {"b": [1, 3]}}, ".a.b[1]"),
        ({"a": [1]}, {"a": [1, 2]}, ".a (2 items, not 1)"),
        ({"a": 1}, {"a": 1, "z": 2}, ".z"),
        ({"a": 1}, None, ""),
    ],
)
def test_first_difference(want: Any, have: Any, where: str | None) -> None:
    assert first_difference(want, have) == where


def deployment(*args: str, replicas: int = 1, ready: int = 1, **template: Any) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "snooze", "name": "snooze-operator"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app.kubernetes.io/component": "operator"}},
            "template": {
                "spec": {
                    "serviceAccountName": "snooze-operator",
                    "containers": [{"name": "operator", "args": ["operator", *args]}],
                    **template,
                }
            },
        },
        "status": {"readyReplicas": ready},
    }


def test_how_the_operator_runs_is_read_from_its_deployment() -> None:
    config = operator_config(
        deployment(
            "--namespace=llm",
            "--namespace",
            "llm-b",
            "--peering=snooze",
            "--gateway-service=snooze/snooze-gateway-metrics",
            replicas=2,
            ready=2,
        )
    )
    assert config == OperatorConfig(
        namespace="snooze",
        name="snooze-operator",
        service_account="snooze-operator",
        peering="snooze",
        watched=("llm", "llm-b"),
        gateway_service=("snooze", "snooze-gateway-metrics"),
        inference_gateway=False,
        replicas=2,
        ready=2,
        pod_selector="app.kubernetes.io/component=operator",
    )
    assert config.user == "system:serviceaccount:snooze:snooze-operator"
    bare = operator_config({"metadata": {"namespace": "x", "name": "y"}})
    assert (bare.service_account, bare.peering, bare.watched) == ("default", None, ())


@pytest.mark.parametrize(
    ("args", "replicas", "ready", "level", "words"),
    [
        ((), 1, 1, Level.OK, "1 of 1 replicas ready, watching every namespace"),
        (("--namespace=llm",), 1, 1, Level.OK, "watching namespaces llm"),
        (("--peering=snooze",), 2, 1, Level.WARNING, "1 of 2 replicas ready"),
        ((), 2, 2, Level.FAILURE, "without --peering"),
        ((), 1, 0, Level.FAILURE, "no replica is ready"),
        ((), 0, 0, Level.FAILURE, "scaled to 0"),
    ],
)
def test_the_operator_line(
    args: tuple[str, ...], replicas: int, ready: int, level: Level, words: str
) -> None:
    found = operator(operator_config(deployment(*args, replicas=replicas, ready=ready)))
    assert found.level is level and words in found.message, found


def peer(priority: int, seconds_ago: float, lifetime: int = 60) -> dict[str, Any]:
    return {"priority": priority, "lifetime": lifetime, "lastseen": format_time(NOW - seconds_ago)}


PEERED = operator_config(deployment("--peering=snooze", replicas=2, ready=2))


@pytest.mark.parametrize(
    ("status", "pods", "level", "words"),
    [
        ({"op-a": peer(200, 5), "op-b": peer(100, 5)}, ["op-a", "op-b"], Level.OK,
         "pod op-a acts (priority 200); 1 standing by"),
        # The first is dead (its keep-alive ran out): the second acts.
        ({"op-a": peer(200, 90), "op-b": peer(100, 5)}, ["op-a", "op-b"], Level.OK,
         "pod op-b acts (priority 100); 0 standing by"),
        ({"op-a": peer(100, 5), "op-b": peer(100, 5)}, ["op-a", "op-b"], Level.FAILURE,
         "share the top priority 100: kopf pauses them all"),
        ({"op-a": peer(200, 90)}, ["op-a"], Level.FAILURE, "no live peer"),
        ({}, ["op-a"], Level.FAILURE, "no live peer"),
        ({"me@laptop": peer(900, 1), "op-a": peer(100, 1)}, ["op-a"], Level.WARNING,
         "me@laptop (priority 900) is not a pod of the Deployment"),
        ({"op-a": "garbage", "op-b": peer(100, 5)}, ["op-a", "op-b"], Level.OK, "pod op-b acts"),
    ],
)  # fmt: skip
def test_the_leader_line_under_peering(
    status: dict[str, Any], pods: list[str], level: Level, words: str
) -> None:
    found = leader(PEERED, peering={"status": status}, failure_text="", pods=pods, now=NOW)
    assert found.level is level and words in found.message, found


def test_a_peering_object_that_cannot_be_read_fails_and_names_the_chart() -> None:
    found = leader(PEERED, peering=None, failure_text="not found", pods=["op-a"], now=NOW)
    assert found.level is Level.FAILURE and "ClusterKopfPeering snooze" in found.message
    assert "peering.yaml" in found.fix
    namespaced = operator_config(deployment("--peering=snooze", "--namespace=llm"))
    found = leader(namespaced, peering=None, failure_text="not found", pods=["op-a"], now=NOW)
    assert "KopfPeering snooze" in found.message and "Cluster" not in found.message


@pytest.mark.parametrize(
    ("pods", "level", "words"),
    [
        (["op-a"], Level.OK, "standalone: pod op-a acts"),
        (["op-a", "op-b"], Level.FAILURE, "each acts alone"),
        ([], Level.FAILURE, "no operator pod is ready"),
    ],
)
def test_the_leader_line_standalone(pods: list[str], level: Level, words: str) -> None:
    config = operator_config(deployment())
    found = leader(config, peering=None, failure_text="", pods=pods, now=NOW)
    assert found.level is level and words in found.message


def test_peers_are_alive_by_kopfs_own_rule() -> None:
    found = peers({"a": peer(1, 59), "b": peer(1, 61), "c": {"priority": "high"}}, NOW)
    assert [(p.identity, p.alive) for p in found] == [("a", True), ("b", False)]


def test_the_reviews_are_every_verb_the_operator_needs_where_it_needs_it() -> None:
    wanted = reviews(operator_config(deployment()))
    verbs = sum(len(p.verbs) for p in rbac.OPERATOR)
    assert len(wanted) == verbs and {r.namespace for r in wanted} == {""}
    status = next(r for r in wanted if r.permission.resource == "inferencemodels/status")
    assert status.attributes() == {
        "verb": "get",
        "group": "snooze.dev",
        "resource": "inferencemodels",
        "subresource": "status",
    }
    namespaced = reviews(
        operator_config(
            deployment(
                "--namespace=llm",
                "--namespace=llm-b",
                "--peering=snooze",
                "--gateway-service=snooze/gw",
            )
        )
    )
    peering = [r for r in namespaced if r.permission.group == "kopf.dev"]
    discovery = [r for r in namespaced if r.permission.resource == "endpointslices"]
    assert {r.permission.resource for r in peering} == {"kopfpeerings"}
    assert {r.namespace for r in peering} == {"llm", "llm-b"}
    assert [(r.verb, r.namespace) for r in discovery] == [("list", "snooze")]
    assert len(namespaced) == 2 * verbs + len(peering) + 1
    behind = reviews(operator_config(deployment("--inference-gateway", "--namespace=llm")))
    assert {r.permission.resource for r in behind} >= {"inferencepools", "services"}
    assert len(behind) == verbs + sum(len(p.verbs) for p in rbac.INFERENCE_GATEWAY)
    cluster_peering = reviews(operator_config(deployment("--peering=snooze")))
    assert {r.permission.resource for r in cluster_peering if r.permission.group == "kopf.dev"} == {
        "clusterkopfpeerings"
    }


def test_the_permissions_line() -> None:
    config = operator_config(deployment())
    wanted = reviews(config)
    allowed = [Review(permission=r.permission, verb=r.verb, namespace=r.namespace, allowed=True)
               for r in wanted]  # fmt: skip
    assert permissions(config, allowed, refused="").level is Level.OK
    denied = [*allowed[1:], Review(permission=wanted[0].permission, verb="get", namespace="",
                                   allowed=False)]  # fmt: skip
    found = permissions(config, denied, refused="")
    assert found.level is Level.FAILURE
    assert "may not get inferencemodels.snooze.dev" in found.message
    assert wanted[0].permission.why in found.message
    assert "rbac.create" in found.fix
    unknown = [*allowed[1:], Review(permission=wanted[0].permission, verb="get", namespace="")]
    assert permissions(config, unknown, refused="").level is Level.WARNING
    refused = permissions(config, [], refused="cannot impersonate serviceaccounts")
    assert refused.level is Level.WARNING
    assert "kubectl auth can-i --list --as=system:serviceaccount:snooze:snooze-operator" in (
        refused.fix
    )


@pytest.mark.parametrize(
    ("version", "level", "words"),
    [
        ({"major": "1", "minor": "34", "gitVersion": "v1.34.4"}, Level.OK, "Kubernetes v1.34.4"),
        ({"major": "1", "minor": "28+", "gitVersion": "v1.28.3-eks"}, Level.OK, "v1.28.3-eks"),
        ({"major": "1", "minor": "27", "gitVersion": "v1.27.9"}, Level.FAILURE, "need 1.28"),
        ({"gitVersion": "v9"}, Level.WARNING, "cannot be read"),
        (None, Level.FAILURE, "no answer from the API server at https://k:6443: refused"),
    ],
)
def test_the_api_line(version: dict[str, str] | None, level: Level, words: str) -> None:
    found = api("https://k:6443", version, "refused")
    assert found.level is level and words in found.message, found
