"""`snooze operator` started against a Kubernetes API that does not answer: one line on stderr
per attempt, naming the API's address and the wait before the next, the waits doubling, no
traceback; and once an API server listens there, the operator serves as if it had been there
all along."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from ports import free_port
from processes import SNOOZE
from waits import wait_for

from snooze.sandbox import Sandbox

from .conftest import CRD

RETRY = re.compile(
    r"\S+ \S+ WARNING snooze\.operator\.startup: the Kubernetes API at (?P<server>\S+) does "
    r"not answer \(GET /version failed: (?P<why>.+)\); trying again in (?P<wait>\S+)"
)


class Operator:
    """The operator as a process, its stderr in a file of its own."""

    def __init__(self, tmp_path: Path, server: str, *python: str) -> None:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "c", "cluster": {"server": server}}],
                    "users": [{"name": "u", "user": {"token": "t"}}],
                    "contexts": [{"name": "here", "context": {"cluster": "c", "user": "u"}}],
                    "current-context": "here",
                }
            )
        )
        self.stderr_path = tmp_path / "stderr"
        with self.stderr_path.open("wb") as stderr:
            self.popen = subprocess.Popen(
                [
                    *SNOOZE[:1],
                    *python,
                    *SNOOZE[1:],
                    *("operator", "--kubeconfig", str(kubeconfig), "--probe-interval", "1s"),
                ],
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )

    @property
    def lines(self) -> list[str]:
        return self.stderr_path.read_text(errors="replace").splitlines()

    def retries(self) -> list[re.Match[str]]:
        return [m for line in self.lines if (m := RETRY.fullmatch(line))]

    def stop(self) -> int:
        self.popen.terminate()
        try:
            return self.popen.wait(30)
        finally:
            self.popen.kill()


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def operator(tmp_path: Path, port: int) -> Iterator[Operator]:
    started = Operator(tmp_path, f"http://127.0.0.1:{port}")
    try:
        yield started
    finally:
        started.stop()


def test_an_api_that_does_not_answer_is_one_line_per_retry(operator: Operator, port: int) -> None:
    wait_for("four attempts", lambda: len(operator.retries()) >= 4, timeout=60)
    lines = operator.lines
    assert "Traceback" not in "\n".join(lines)
    retries = operator.retries()
    # Every line is one attempt's: nothing else is said meanwhile.
    assert len(retries) == len(lines), "\n".join(lines)
    for retry in retries:
        assert retry["server"] == f"http://127.0.0.1:{port}"
        assert f"127.0.0.1:{port}" in retry["why"]
    assert [retry["wait"] for retry in retries[:4]] == ["1s", "2s", "4s", "8s"]
    assert operator.popen.poll() is None, "it keeps trying"


def test_stopped_while_the_api_does_not_answer_it_closes_its_clients(
    tmp_path: Path, port: int
) -> None:
    """kopf runs no cleanup after a start-up it cancelled: start-up closes what it opened."""
    operator = Operator(tmp_path, f"http://127.0.0.1:{port}", "-W", "always::ResourceWarning")
    try:
        wait_for("two attempts", lambda: len(operator.retries()) >= 2, timeout=60)
    finally:
        assert operator.stop() == 0
    said = "\n".join(operator.lines)
    assert "ResourceWarning" not in said, said
    assert "Traceback" not in said, said


def test_the_operator_serves_once_the_api_answers(operator: Operator, port: int) -> None:
    wait_for("two attempts", lambda: len(operator.retries()) >= 2, timeout=60)
    with Sandbox(port=port) as sandbox:
        for path in sorted(CRD.parent.glob("*.yaml")):
            crd = yaml.safe_load(path.read_text())
            url = f"{sandbox.url}/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
            assert httpx.post(url, json=crd).status_code == 201
        models = f"{sandbox.url}/apis/snooze.dev/v1alpha1/namespaces/default/inferencemodels"
        model = {
            "apiVersion": "snooze.dev/v1alpha1",
            "kind": "InferenceModel",
            "metadata": {"name": "chat"},
            "spec": {"selector": {"matchLabels": {"app": "chat"}}},
        }
        assert httpx.post(models, json=model).status_code == 201

        def ready() -> dict[str, str] | None:
            status = httpx.get(f"{models}/chat").json().get("status") or {}
            found = [c for c in status.get("conditions") or [] if c["type"] == "Ready"]
            return found[0] if found else None

        # The model has no pod: the operator says so on its status, as it would have anyway.
        condition = wait_for("the operator's status of the model", ready, timeout=60)
        assert condition["reason"] == "NoPods"
        answered = [line for line in operator.lines if "answers (attempt" in line]
        assert len(answered) == 1, operator.lines
        assert f"the Kubernetes API at http://127.0.0.1:{port} answers" in answered[0]
        assert operator.stop() == 0
    assert "Traceback" not in "\n".join(operator.lines)


def test_an_api_that_refuses_the_credentials_is_one_line_per_retry(
    operator: Operator, port: int
) -> None:
    """Answered but refused (a revoked token, RBAC): the line says so, with the API's reason."""
    with Sandbox(port=port) as sandbox:
        sandbox.accept_tokens("another-token")
        refused = wait_for(
            "two refusals",
            lambda: [line for line in operator.lines if "refused a start-up read" in line][1:],
            timeout=60,
        )
        assert f"the Kubernetes API at http://127.0.0.1:{port} refused" in refused[0]
        assert "Unauthorized: the API refuses the credentials of kubeconfig" in refused[0]
        assert "trying again in" in refused[0]
        assert "Traceback" not in "\n".join(operator.lines)
