"""The sandbox against the real `kubernetes` client: each gap of kmock 0.8 that it fills."""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any

import kubernetes.client
import kubernetes.watch
import pytest
import urllib3
from builders import pod
from kubernetes.client import ApiException, CoreV1Api, CustomObjectsApi

from snooze.sandbox import Sandbox

CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.example.dev"},
    "spec": {
        "group": "example.dev",
        "scope": "Namespaced",
        "names": {
            "plural": "widgets",
            "singular": "widget",
            "kind": "Widget",
            "shortNames": ["wdg"],
        },
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
                "subresources": {
                    "status": {},
                    "scale": {
                        "specReplicasPath": ".spec.replicas",
                        "statusReplicasPath": ".status.replicas",
                    },
                },
            }
        ],
    },
}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def crd(sandbox: Sandbox) -> dict[str, Any]:
    config = kubernetes.client.Configuration()
    config.host = sandbox.url
    with kubernetes.client.ApiClient(config) as api_client:
        api = kubernetes.client.ApiextensionsV1Api(api_client)
        created: dict[str, Any] = api_client.sanitize_for_serialization(
            api.create_custom_resource_definition(CRD)
        )
        return created


def raw(
    client: kubernetes.client.ApiClient,
    method: str,
    path: str,
    body: Any = None,
    content_type: str = "application/json",
) -> tuple[int, Any]:
    """A request whose status and body we inspect ourselves, errors included."""
    response = urllib3.request(
        method,
        client.configuration.host + path,
        body=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": content_type},
    )
    return response.status, json.loads(response.data) if response.data else None


def test_namespaces_list_and_get(client: kubernetes.client.ApiClient) -> None:
    core = CoreV1Api(client)
    names = {ns.metadata.name for ns in core.list_namespace().items}
    assert {"default", "kube-system"} <= names
    name = unique("ns")
    core.create_namespace({"metadata": {"name": name}})
    assert core.read_namespace(name).status.phase == "Active"


def test_system_fields_and_201(client: kubernetes.client.ApiClient) -> None:
    status, created = raw(client, "POST", "/api/v1/namespaces/default/pods", pod(name=unique("p")))
    assert status == 201
    meta = created["metadata"]
    uuid.UUID(meta["uid"])
    assert meta["creationTimestamp"].endswith("Z") and meta["generation"] == 1
    again = CoreV1Api(client).create_namespaced_pod("default", pod(name=unique("p")))
    assert int(again.metadata.resource_version) > int(meta["resourceVersion"])


def test_generate_name(client: kubernetes.client.ApiClient) -> None:
    event = CoreV1Api(client).create_namespaced_event(
        "default",
        {
            "metadata": {"generateName": "snooze-"},
            "involvedObject": {"kind": "Pod", "name": "x", "namespace": "default"},
            "reason": "Test",
            "message": "hello",
            "type": "Normal",
        },
    )
    assert event.metadata.name.startswith("snooze-") and len(event.metadata.name) == 12


def test_errors_are_status_bodies(client: kubernetes.client.ApiClient) -> None:
    status, body = raw(client, "GET", "/api/v1/namespaces/default/pods/absent")
    assert status == 404
    assert body["kind"] == "Status" and body["status"] == "Failure"
    assert body["reason"] == "NotFound" and body["code"] == 404
    name = unique("p")
    raw(client, "POST", "/api/v1/namespaces/default/pods", pod(name=name))
    status, body = raw(client, "POST", "/api/v1/namespaces/default/pods", pod(name=name))
    assert (status, body["reason"]) == (409, "AlreadyExists")


def test_label_and_field_selectors_on_list(client: kubernetes.client.ApiClient) -> None:
    core = CoreV1Api(client)
    ns = unique("sel")
    core.create_namespace({"metadata": {"name": ns}})
    core.create_namespaced_pod(ns, pod(name="a", labels={"app": "web", "tier": "front"}))
    core.create_namespaced_pod(ns, pod(name="b", labels={"app": "db"}))
    core.create_namespaced_pod(ns, pod(name="c", labels={}))

    def names(**kwargs: str) -> list[str]:
        return [p.metadata.name for p in core.list_namespaced_pod(ns, **kwargs).items]

    assert names(label_selector="app=web") == ["a"]
    assert names(label_selector="app==web") == ["a"]
    assert names(label_selector="app!=web") == ["b", "c"]
    assert names(label_selector="app in (web,db)") == ["a", "b"]
    assert names(label_selector="app notin (web)") == ["b", "c"]
    assert names(label_selector="app") == ["a", "b"]
    assert names(label_selector="!app") == ["c"]
    assert names(label_selector="app,tier=front") == ["a"]
    assert names(field_selector="metadata.name=b") == ["b"]
    assert names(field_selector="metadata.name!=b") == ["a", "c"]
    assert [
        p.metadata.name
        for p in core.list_pod_for_all_namespaces(field_selector=f"metadata.namespace={ns}").items
    ] == ["a", "b", "c"]
    with pytest.raises(ApiException) as err:
        core.list_namespaced_pod(ns, field_selector="spec.nothing=1")
    assert err.value.status == 400


def test_watch_from_resource_version_with_selectors(client: kubernetes.client.ApiClient) -> None:
    core = CoreV1Api(client)
    ns = unique("watch")
    core.create_namespace({"metadata": {"name": ns}})
    core.create_namespaced_pod(ns, pod(name="before", labels={"app": "web"}))
    listed = core.list_namespaced_pod(ns)
    since = listed.metadata.resource_version
    core.create_namespaced_pod(ns, pod(name="after", labels={"app": "web"}))
    core.create_namespaced_pod(ns, pod(name="other", labels={"app": "db"}))
    core.patch_namespaced_pod("after", ns, {"metadata": {"labels": {"app": "gone"}}})

    response = core.list_namespaced_pod(
        ns,
        watch=True,
        resource_version=since,
        label_selector="app=web",
        timeout_seconds=1,
        _preload_content=False,
    )
    assert response.headers["Content-Type"] == "application/json"
    events = [json.loads(line) for line in response.data.splitlines() if line]
    # Nothing from before `since`; the pod that stops matching is seen as DELETED.
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "after"),
        ("DELETED", "after"),
    ]


def test_watch_streams_live_events(client: kubernetes.client.ApiClient) -> None:
    core = CoreV1Api(client)
    ns = unique("live")
    core.create_namespace({"metadata": {"name": ns}})
    since = core.list_namespaced_pod(ns).metadata.resource_version
    creator = threading.Timer(0.2, lambda: core.create_namespaced_pod(ns, pod(name="late")))
    creator.start()
    watch = kubernetes.watch.Watch()
    seen = []
    for event in watch.stream(
        core.list_namespaced_pod, ns, resource_version=since, timeout_seconds=5
    ):
        seen.append((event["type"], event["object"].metadata.name))
        watch.stop()
    assert seen == [("ADDED", "late")]


def test_stale_update_conflicts(client: kubernetes.client.ApiClient) -> None:
    core = CoreV1Api(client)
    name = unique("cm")
    cm = core.create_namespaced_config_map(
        "default", {"metadata": {"name": name}, "data": {"k": "1"}}
    )
    cm.data = {"k": "2"}
    core.replace_namespaced_config_map(name, "default", cm)
    cm.data = {"k": "3"}  # still carries the old resourceVersion
    with pytest.raises(ApiException) as err:
        core.replace_namespaced_config_map(name, "default", cm)
    assert err.value.status == 409 and json.loads(err.value.body)["reason"] == "Conflict"
    stale = {"metadata": {"resourceVersion": cm.metadata.resource_version}, "data": {"k": "4"}}
    status, body = raw(
        client,
        "PATCH",
        f"/api/v1/namespaces/default/configmaps/{name}",
        stale,
        "application/merge-patch+json",
    )
    assert (status, body["reason"]) == (409, "Conflict")


def test_json_patch_test_op(client: kubernetes.client.ApiClient) -> None:
    core = CoreV1Api(client)
    name = unique("cm")
    cm = core.create_namespaced_config_map("default", {"metadata": {"name": name}})
    path = f"/api/v1/namespaces/default/configmaps/{name}"
    rv = cm.metadata.resource_version
    ops = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
        {"op": "add", "path": "/data", "value": {"k": "v"}},
    ]
    status, body = raw(client, "PATCH", path, ops, "application/json-patch+json")
    assert status == 200 and body["data"] == {"k": "v"}
    status, body = raw(client, "PATCH", path, ops, "application/json-patch+json")
    assert (status, body["reason"]) == (422, "Invalid")  # as the API server answers


def test_no_op_write_keeps_resource_version(client: kubernetes.client.ApiClient) -> None:
    core = CoreV1Api(client)
    name = unique("cm")
    cm = core.create_namespaced_config_map("default", {"metadata": {"name": name}})
    same = core.patch_namespaced_config_map(name, "default", {"metadata": {"labels": None}})
    assert same.metadata.resource_version == cm.metadata.resource_version


def test_crd_discovery_and_custom_objects(
    client: kubernetes.client.ApiClient, crd: dict[str, Any]
) -> None:
    status, group = raw(client, "GET", "/apis/example.dev")
    assert status == 200 and group["preferredVersion"]["version"] == "v1"
    _, resources = raw(client, "GET", "/apis/example.dev/v1")
    by_name = {r["name"]: r for r in resources["resources"]}
    assert by_name["widgets"]["shortNames"] == ["wdg"] and by_name["widgets"]["namespaced"]
    assert {"widgets/status", "widgets/scale"} <= set(by_name)
    established = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert established["Established"] == "True"

    custom = CustomObjectsApi(client)
    args = ("example.dev", "v1", "default", "widgets")
    obj = custom.create_namespaced_custom_object(
        *args,
        {
            "apiVersion": "example.dev/v1",
            "kind": "Widget",
            "metadata": {"name": "w1"},
            "spec": {"replicas": 1},
            "status": {"ignored": True},
        },
    )
    assert "status" not in obj and obj["metadata"]["generation"] == 1
    listed = custom.list_namespaced_custom_object(*args)
    assert [o["metadata"]["name"] for o in listed["items"]] == ["w1"]
    obj["spec"]["replicas"] = 2
    obj = custom.replace_namespaced_custom_object(*args, "w1", obj)
    assert obj["metadata"]["generation"] == 2
    custom.delete_namespaced_custom_object(*args, "w1")
    assert custom.list_namespaced_custom_object(*args)["items"] == []


def test_status_subresource_is_separate(
    client: kubernetes.client.ApiClient, crd: dict[str, Any]
) -> None:
    custom = CustomObjectsApi(client)
    args = ("example.dev", "v1", "default", "widgets")
    name = unique("w")
    obj = custom.create_namespaced_custom_object(
        *args,
        {
            "apiVersion": "example.dev/v1",
            "kind": "Widget",
            "metadata": {"name": name},
            "spec": {"replicas": 1},
        },
    )
    rv0 = int(obj["metadata"]["resourceVersion"])
    obj = custom.patch_namespaced_custom_object_status(
        *args, name, {"status": {"phase": "Awake"}, "spec": {"replicas": 9}}
    )
    assert obj["status"] == {"phase": "Awake"} and obj["spec"] == {"replicas": 1}
    assert obj["metadata"]["generation"] == 1 and int(obj["metadata"]["resourceVersion"]) > rv0
    obj = custom.patch_namespaced_custom_object(
        *args, name, {"status": {"phase": "Asleep"}, "metadata": {"labels": {"a": "b"}}}
    )
    assert obj["status"] == {"phase": "Awake"} and obj["metadata"]["generation"] == 1
    obj["status"] = {"phase": "Asleep"}
    obj = custom.replace_namespaced_custom_object_status(*args, name, obj)
    assert obj["status"] == {"phase": "Asleep"}


def test_scale_subresource(client: kubernetes.client.ApiClient) -> None:
    apps = kubernetes.client.AppsV1Api(client)
    name = unique("d")
    apps.create_namespaced_deployment(
        "default",
        {
            "metadata": {"name": name},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": {"containers": [{"name": "c", "image": "x"}]},
                },
            },
        },
    )
    scale = apps.read_namespaced_deployment_scale(name, "default")
    assert scale.spec.replicas == 2 and scale.status.selector == f"app={name}"
    apps.patch_namespaced_deployment_scale(name, "default", {"spec": {"replicas": 0}})
    deployment = apps.read_namespaced_deployment(name, "default")
    assert deployment.spec.replicas == 0 and deployment.metadata.generation == 2


def test_finalizers_hold_deletion(client: kubernetes.client.ApiClient) -> None:
    core = CoreV1Api(client)
    name = unique("cm")
    core.create_namespaced_config_map(
        "default", {"metadata": {"name": name, "finalizers": ["snooze.dev/test"]}}
    )
    core.delete_namespaced_config_map(name, "default")
    held = core.read_namespaced_config_map(name, "default")
    assert held.metadata.deletion_timestamp is not None
    core.patch_namespaced_config_map(name, "default", {"metadata": {"finalizers": None}})
    with pytest.raises(ApiException) as err:
        core.read_namespaced_config_map(name, "default")
    assert err.value.status == 404


def test_leases(client: kubernetes.client.ApiClient) -> None:
    coordination = kubernetes.client.CoordinationV1Api(client)
    lease = coordination.create_namespaced_lease(
        "default", {"metadata": {"name": unique("lease")}, "spec": {"holderIdentity": "me"}}
    )
    assert lease.spec.holder_identity == "me"


def test_fault_injection_and_counts(sandbox: Sandbox, client: kubernetes.client.ApiClient) -> None:
    core = CoreV1Api(client)
    before = sandbox.requests_count("GET")
    sandbox.inject_fault(method="GET", path_contains="/namespaces/default", status=409, times=1)
    with pytest.raises(ApiException) as err:
        core.read_namespace("default")
    assert err.value.status == 409 and json.loads(err.value.body)["kind"] == "Status"
    assert core.read_namespace("default").metadata.name == "default"
    assert sandbox.requests_count("GET") == before + 2
    assert sandbox.requests_count() >= sandbox.requests_count("GET")


def test_merge_patch_of_spec_keeps_system_metadata(client: kubernetes.client.ApiClient) -> None:
    """A merge patch that names only .spec leaves name, uid and timestamps as they were."""
    api = kubernetes.client.CoreV1Api(client)
    api.create_namespaced_config_map(
        "default", {"metadata": {"name": "keep-meta"}, "data": {"a": "1"}}
    )
    before = api.read_namespaced_config_map("keep-meta", "default").metadata
    api.patch_namespaced_config_map(
        "keep-meta", "default", {"data": {"a": "2"}}, _content_type="application/merge-patch+json"
    )
    after = api.read_namespaced_config_map("keep-meta", "default").metadata
    assert (after.name, after.namespace, after.uid) == (before.name, before.namespace, before.uid)
    assert after.creation_timestamp == before.creation_timestamp
    assert int(after.resource_version) > int(before.resource_version)


def test_an_access_review_is_answered_as_an_authorizer_that_allows_everything(
    client: kubernetes.client.ApiClient, sandbox: Sandbox
) -> None:
    """The sandbox has no RBAC: a SelfSubjectAccessReview (impersonating anyone, as everyone
    may) is answered allowed, as kube-apiserver --authorization-mode=AlwaysAllow answers it,
    and nothing is stored."""
    authorization = kubernetes.client.AuthorizationV1Api(client)
    review = kubernetes.client.V1SelfSubjectAccessReview(
        spec=kubernetes.client.V1SelfSubjectAccessReviewSpec(
            resource_attributes=kubernetes.client.V1ResourceAttributes(
                verb="patch", group="snooze.dev", resource="inferencemodels", subresource="status"
            )
        )
    )
    client.default_headers["Impersonate-User"] = "system:serviceaccount:snooze:snooze-operator"
    try:
        answer = authorization.create_self_subject_access_review(review)
    finally:
        del client.default_headers["Impersonate-User"]
    assert answer.status.allowed is True
    assert answer.spec.resource_attributes.subresource == "status"
    path = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
    assert client.call_api("GET", sandbox.url + path).status == 405
