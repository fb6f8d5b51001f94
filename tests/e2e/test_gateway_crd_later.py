"""A gateway started before the InferenceModel CRD: it says what is missing, and once the CRD
is installed a request is answered from the API's list, not from what the gateway knew."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from gateway_fixtures import start_gateway

from snooze.gateway.embedded import GatewayThread
from snooze.sandbox import Sandbox

from .conftest import CRD

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def early_gateway(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Sandbox, GatewayThread]]:
    """A sandbox without the CRD, and a gateway that started on it."""
    with Sandbox() as sandbox:
        monkeypatch.setenv("KUBECONFIG", str(sandbox.write_kubeconfig(tmp_path / "kubeconfig")))
        gateway = start_gateway()
        yield sandbox, gateway
        gateway.stop()


def test_a_request_before_the_crd_is_told_to_install_it(
    early_gateway: tuple[Sandbox, GatewayThread],
) -> None:
    _, gateway = early_gateway
    answer = httpx.post(f"{gateway.url}/v1/chat/completions", json=CHAT, timeout=30)
    assert answer.status_code == 503, answer.text
    assert answer.headers["Retry-After"] == "1"
    error = answer.json()["error"]
    assert error["code"] == "not_ready"
    assert "the InferenceModel CRD is not installed" in error["message"]
    assert "kubectl apply -f crds/" in error["message"]


def test_a_request_just_after_the_crd_is_answered_from_the_new_list(
    early_gateway: tuple[Sandbox, GatewayThread],
) -> None:
    sandbox, gateway = early_gateway
    # The gateway has looked for the CRD and not found it.
    first = httpx.post(f"{gateway.url}/v1/chat/completions", json=CHAT, timeout=30)
    assert "CRD is not installed" in first.json()["error"]["message"]
    created = httpx.post(
        f"{sandbox.url}/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        json=yaml.safe_load(CRD.read_text()),
    )
    assert created.status_code == 201, created.text
    # At once, before the gateway's next look: the request waits for it, and is then told
    # that no InferenceModel serves `chat` (none was created), not that the CRD is missing.
    answer = httpx.post(f"{gateway.url}/v1/chat/completions", json=CHAT, timeout=30)
    assert answer.status_code == 404, answer.text
    assert answer.json()["error"]["code"] == "model_not_found"
