"""The sandbox held to the real API server: each check here runs against both, so that what
`snooze sandbox` does differently from Kubernetes is a failing test, not a surprise on a
cluster. What it knowingly does not do is listed in docs/getting-started.md (its walkthrough)."""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest
from kube import Kube, wait_for
from kubernetes.client.rest import ApiException

from snooze.api.agreed import AWAKE_CONDITION
from snooze.api.times import parse_time
from snooze.kube.api import STRATEGIC_MERGE_PATCH as STRATEGIC
from snooze.kube.pods import condition_patch
from snooze.sandbox import Sandbox

GROUP, VERSION, PLURAL = "parity.snooze.test", "v1", "widgets"
NAMESPACE = "parity"
# A kind of the tests' own, which no operator watches (an operator's finalizers and status
# writes would race the checks), with what the checks need: a status subresource, a pattern,
# a default, and fields a strict decoder refuses when unknown.
WIDGETS = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"{PLURAL}.{GROUP}"},
    "spec": {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {"plural": PLURAL, "singular": "widget", "kind": "Widget",
                  "listKind": "WidgetList"},
        "versions": [{
            "name": VERSION, "served": True, "storage": True,
            "subresources": {"status": {}},
            "schema": {"openAPIV3Schema": {
                "type": "object",
                "properties": {
                    "spec": {"type": "object", "properties": {
                        "size": {"type": "string", "pattern": "^[0-9]+Gi$", "default": "1Gi"},
                        "count": {"type": "integer", "minimum": 0},
                    }},
                    "status": {"type": "object", "properties": {"phase": {"type": "string"}}},
                },
            }},
        }],
    },
}  # fmt: skip


@pytest.fixture(scope="module", params=["sandbox", "kubernetes"])
def api(request: pytest.FixtureRequest) -> Iterator[kubernetes.client.ApiClient]:
    """A client of the sandbox, or of the real API server, with the CRDs and a namespace."""
    if request.param == "sandbox":
        with Sandbox() as sandbox:
            config = kubernetes.client.Configuration()
            config.host = sandbox.url
            with kubernetes.client.ApiClient(config) as client:
                _prepare(client)
                yield client
        return
    kube: Kube = request.getfixturevalue("kube")
    request.getfixturevalue("crds")
    _prepare(kube.api)
    yield kube.api


def _prepare(client: kubernetes.client.ApiClient) -> None:
    extensions = kubernetes.client.ApiextensionsV1Api(client)
    try:
        extensions.create_custom_resource_definition(WIDGETS)
    except ApiException as error:
        assert error.status == 409, error.body
    wait_for(
        "the widgets' CRD served",
        lambda: _served(kubernetes.client.CustomObjectsApi(client)),
    )
    core = kubernetes.client.CoreV1Api(client)
    try:
        core.create_namespace({"metadata": {"name": NAMESPACE}})
    except ApiException as error:
        assert error.status == 409, error.body


RUN = uuid.uuid4().hex[:6]
"""Names and labels of this run: another run's objects (on a shared cluster) are not ours."""


def _served(custom: kubernetes.client.CustomObjectsApi) -> bool:
    try:
        custom.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL)
    except ApiException:
        return False
    return True


# Not tests/builders.py's model: a Widget, the parity CRD's own kind.
def model(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Widget",
        "metadata": {"name": name, "labels": {"team": "a", "run": RUN}},
        "spec": {"count": 1, **spec},
    }


def objects(api: kubernetes.client.ApiClient) -> kubernetes.client.CustomObjectsApi:
    return kubernetes.client.CustomObjectsApi(api)


def status_of(error: ApiException) -> int:
    return int(error.status)


def test_a_crd_whose_default_breaks_its_schema_is_refused(api: Any) -> None:
    crd = copy.deepcopy(WIDGETS)
    crd["metadata"]["name"] = f"brokens.{GROUP}"
    crd["spec"]["names"] = {"plural": "brokens", "singular": "broken", "kind": "Broken",
                            "listKind": "BrokenList"}  # fmt: skip
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    schema["properties"]["size"]["default"] = 12  # a string field defaulted to a number
    with pytest.raises(ApiException) as refused:
        kubernetes.client.ApiextensionsV1Api(api).create_custom_resource_definition(crd)
    assert status_of(refused.value) == 422, refused.value.body


def test_create_fills_in_the_metadata(api: Any) -> None:
    made = objects(api).create_namespaced_custom_object(
        GROUP, VERSION, NAMESPACE, PLURAL, model("made")
    )
    meta = made["metadata"]
    assert meta["uid"] and meta["resourceVersion"] and meta["creationTimestamp"]
    assert meta["generation"] == 1
    objects(api).delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, "made")


def test_a_stale_update_is_a_conflict(api: Any) -> None:
    made = objects(api).create_namespaced_custom_object(
        GROUP, VERSION, NAMESPACE, PLURAL, model("stale")
    )
    try:
        fresh = copy.deepcopy(made)
        fresh["metadata"]["labels"]["team"] = "b"
        objects(api).replace_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, PLURAL, "stale", fresh
        )
        made["metadata"]["labels"]["team"] = "c"
        with pytest.raises(ApiException) as conflict:
            objects(api).replace_namespaced_custom_object(
                GROUP, VERSION, NAMESPACE, PLURAL, "stale", made
            )
        assert status_of(conflict.value) == 409
    finally:
        objects(api).delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, "stale")


def test_generation_counts_spec_changes_only(api: Any) -> None:
    custom = objects(api)
    custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, model("gen"))
    try:
        custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, NAMESPACE, PLURAL, "gen", {"status": {"phase": "Awake"}}
        )
        custom.patch_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, PLURAL, "gen", {"metadata": {"labels": {"x": "y"}}}
        )
        after = custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, "gen")
        assert after["metadata"]["generation"] == 1
        custom.patch_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, PLURAL, "gen", {"spec": {"count": 2}}
        )
        after = custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, "gen")
        assert after["metadata"]["generation"] == 2
    finally:
        custom.delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, "gen")


def test_the_status_subresource_keeps_to_status_and_prunes(api: Any) -> None:
    custom = objects(api)
    custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, model("sub"))
    try:
        custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, NAMESPACE, PLURAL, "sub",
            {"spec": {"count": 3}, "status": {"phase": "Asleep", "madeUp": 1}},
        )  # fmt: skip
        stored = custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, "sub")
        assert stored["status"]["phase"] == "Asleep"
        assert "madeUp" not in stored["status"]
        assert stored["spec"]["count"] == 1
    finally:
        custom.delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, "sub")


def test_label_selectors_filter_lists(api: Any) -> None:
    custom = objects(api)
    custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, model("sel"))
    try:
        found = custom.list_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, PLURAL, label_selector=f"team=a,run={RUN}"
        )
        assert [i["metadata"]["name"] for i in found["items"]] == ["sel"]
        none = custom.list_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, PLURAL, label_selector=f"team notin (a),run={RUN}"
        )
        assert none["items"] == []
    finally:
        custom.delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, "sel")


def test_an_unknown_field_is_refused_when_strict(api: Any) -> None:
    body = model("strict")
    body["spec"]["colour"] = "red"
    with pytest.raises(ApiException) as refused:
        objects(api).create_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, PLURAL, body, field_validation="Strict"
        )
    # 400 (a strict decoding error) from both, naming the field.
    assert status_of(refused.value) == 400
    assert 'unknown field \\"spec.colour\\"' in refused.value.body


def test_one_pod_condition_is_merged_by_type_through_its_status(api: Any) -> None:
    """The operator's write of its readiness gate (kube/pods.py condition_patch, a strategic
    merge of pods/status): merged into the conditions by type, the kubelet's left as they are,
    the transition time kept when the patch leaves it out."""
    core = kubernetes.client.CoreV1Api(api)
    name = f"gated-{RUN}"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            # Bound to no node of the cluster: no kubelet writes its status but this test.
            "nodeName": "parity-nowhere",
            "readinessGates": [{"conditionType": AWAKE_CONDITION}],
            "containers": [{"name": "engine", "image": "registry.invalid/none"}],
        },
    }

    def created() -> bool:
        # A fresh namespace's default ServiceAccount comes a moment after it (its controller
        # makes it), and until then the API server refuses pods there.
        try:
            core.create_namespaced_pod(NAMESPACE, pod)
        except ApiException as error:
            if status_of(error) == 403 and "serviceaccount" in str(error.body).lower():
                return False
            raise
        return True

    wait_for("the pod created", created)

    def patch(body: dict[str, Any]) -> None:
        core.patch_namespaced_pod_status(name, NAMESPACE, body, _content_type=STRATEGIC)

    try:
        kubelet = [
            {"type": "ContainersReady", "status": "True"},
            {"type": "Ready", "status": "False", "reason": "ReadinessGatesNotReady"},
        ]
        patch({"status": {"conditions": kubelet}})
        for serves, reason, since in ((True, "Awake", 0.0), (False, "Asleep", None)):
            patch(
                condition_patch(
                    AWAKE_CONDITION, status=serves, reason=reason, message=reason, since=since
                )
            )
        stored = json.loads(core.read_namespaced_pod(name, NAMESPACE, _preload_content=False).data)
        found = {c["type"]: c for c in stored["status"]["conditions"]}
        assert set(found) == {"ContainersReady", "Ready", AWAKE_CONDITION}
        assert found["Ready"]["reason"] == "ReadinessGatesNotReady"
        gate = found[AWAKE_CONDITION]
        assert (gate["status"], gate["reason"], gate["message"]) == ("False", "Asleep", "Asleep")
        assert parse_time(gate["lastTransitionTime"]) == 0.0
        assert stored["spec"]["readinessGates"] == [{"conditionType": AWAKE_CONDITION}]
    finally:
        core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)
