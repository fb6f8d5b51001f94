"""Real kopf against the sandbox: a new CRD, a handled resource, a status patch, an Event."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from typing import Any

import kopf
import kubernetes.client
import pytest
from kubernetes.client import ApiException, CoreV1Api, CustomObjectsApi
from waits import wait_for

from snooze.sandbox import Sandbox

CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "sleepers.example.dev"},
    "spec": {
        "group": "example.dev",
        "scope": "Namespaced",
        "names": {"plural": "sleepers", "singular": "sleeper", "kind": "Sleeper"},
        "versions": [
            {"name": "v1", "served": True, "storage": True, "subresources": {"status": {}}}
        ],
    },
}
ARGS = ("example.dev", "v1", "default", "sleepers")


@pytest.fixture
def sleepers(client: kubernetes.client.ApiClient) -> None:
    """The CRD, installed before kopf starts. kopf finds resources by listing /apis, then
    watches CRDs for new ones but skips the watch's first listing: a CRD created between the
    two is never served (the test failed 4 runs in 5 so). The operator's own CRD discovery,
    which polls, is tested in tests/e2e/test_operator_crd_later.py."""
    kubernetes.client.ApiextensionsV1Api(client).create_custom_resource_definition(CRD)


@pytest.fixture
def operator(sandbox: Sandbox, sleepers: None) -> Iterator[kopf.OperatorRegistry]:
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=sandbox.url)

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.posting.level = logging.INFO
        settings.watching.server_timeout = 5
        settings.persistence.finalizer = "example.dev/kopf-finalizer"

    @kopf.on.create("example.dev", "v1", "sleepers", registry=registry)
    def created(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        patch.status["phase"] = "Seen"
        kopf.info(body, reason="Seen", message="the sandbox works")

    @kopf.on.delete("example.dev", "v1", "sleepers", registry=registry)
    def deleted(**_: Any) -> None:
        pass

    stop_flag = threading.Event()
    thread = threading.Thread(
        target=lambda: asyncio.run(
            kopf.operator(
                registry=registry,
                clusterwide=True,
                standalone=True,
                stop_flag=stop_flag,
            )
        ),
        daemon=True,
    )
    thread.start()
    yield registry
    stop_flag.set()
    thread.join(timeout=10)


def test_kopf_handles_a_custom_resource(
    sandbox: Sandbox, client: kubernetes.client.ApiClient, operator: kopf.OperatorRegistry
) -> None:
    custom = CustomObjectsApi(client)
    custom.create_namespaced_custom_object(
        *ARGS,
        {
            "apiVersion": "example.dev/v1",
            "kind": "Sleeper",
            "metadata": {"name": "s1"},
            "spec": {"model": "tiny"},
        },
    )

    def phase() -> Any:
        return custom.get_namespaced_custom_object(*ARGS, "s1").get("status", {}).get("phase")

    assert wait_for("kopf's status phase", phase, 10) == "Seen"
    obj = custom.get_namespaced_custom_object(*ARGS, "s1")
    assert "example.dev/kopf-finalizer" in obj["metadata"]["finalizers"]

    def events() -> list[Any]:
        return [
            e
            for e in CoreV1Api(client)
            .list_namespaced_event("default", field_selector="involvedObject.name=s1")
            .items
            if e.reason == "Seen"
        ]

    assert wait_for("kopf's Event", events, 10)[0].metadata.name.startswith("kopf-event-")

    custom.delete_namespaced_custom_object(*ARGS, "s1")

    def gone() -> bool:
        try:
            custom.get_namespaced_custom_object(*ARGS, "s1")
        except ApiException as exc:
            return exc.status == 404
        return False

    assert wait_for("s1 deleted", gone, 10)
