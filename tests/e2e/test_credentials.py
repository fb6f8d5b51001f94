"""Credentials as EKS, GKE and AKS kubeconfigs give them: an exec plugin prints a token, the
API server checks it, and a token it stops accepting (401) is replaced by a fresh login.

The sandbox accepts only the tokens a test names (`Sandbox.accept_tokens`) and counts those
it saw, so each test proves what reached the API server.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from ports import free_port
from processes import Process
from waits import wait_for

from snooze.kube.api import KubeApi, models_ref
from snooze.kube.credentials import Source

from .conftest import Cluster

LABELS = {"app": "chat"}
# Prints an ExecCredential whose token is named by a file the test writes, and counts its runs.
PLUGIN = """
import json, pathlib, sys
here = pathlib.Path(sys.argv[1])
runs = here / "runs"
runs.write_text(str(int(runs.read_text() if runs.exists() else "0") + 1))
status = {"token": (here / "token").read_text().strip()}
if (here / "expiry").exists():
    status["expirationTimestamp"] = (here / "expiry").read_text().strip()
print(json.dumps({
    "apiVersion": "client.authentication.k8s.io/v1",
    "kind": "ExecCredential",
    "status": status,
}))
"""


class Plugin:
    """An exec credential plugin and the kubeconfig that runs it, as cloud kubeconfigs do."""

    def __init__(self, tmp: Path, server: str) -> None:
        self.dir = tmp / "plugin"
        self.dir.mkdir()
        (self.dir / "plugin.py").write_text(PLUGIN)
        self.issue("token-1")
        self.kubeconfig = tmp / "exec-kubeconfig"
        user = {
            "exec": {
                "apiVersion": "client.authentication.k8s.io/v1",
                "command": sys.executable,
                "args": [str(self.dir / "plugin.py"), str(self.dir)],
                "interactiveMode": "Never",
            }
        }
        self.kubeconfig.write_text(yaml.safe_dump(kubeconfig(server, user=user)))

    def issue(self, token: str) -> None:
        """What the plugin prints from now on."""
        (self.dir / "token").write_text(token)

    @property
    def runs(self) -> int:
        runs = self.dir / "runs"
        return int(runs.read_text()) if runs.exists() else 0


def kubeconfig(
    server: str, *, user: dict[str, Any], context: str = "sandbox", current: str | None = None
) -> dict[str, Any]:
    contexts = [{"name": context, "context": {"cluster": "sandbox", "user": "me"}}]
    clusters = [{"name": "sandbox", "cluster": {"server": server}}]
    if current is not None and current != context:
        # Another cluster, current by default: only --context reaches the sandbox.
        clusters.append({"name": "elsewhere", "cluster": {"server": "http://127.0.0.1:9"}})
        contexts.append({"name": current, "context": {"cluster": "elsewhere", "user": "me"}})
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": clusters,
        "users": [{"name": "me", "user": user}],
        "contexts": contexts,
        "current-context": current or context,
    }


@pytest.fixture
def guarded(cluster: Cluster) -> Cluster:
    """The sandbox lets in only the test's own token (and those a test adds)."""
    cluster.http.headers["Authorization"] = "Bearer admin"
    cluster.sandbox.accept_tokens("admin")
    return cluster


def test_a_refused_token_is_replaced_by_a_fresh_login(guarded: Cluster, tmp_path: Path) -> None:
    plugin = Plugin(tmp_path, guarded.sandbox.url)
    guarded.sandbox.accept_tokens("admin", "token-1")

    async def scenario() -> tuple[int, int]:
        api = KubeApi(Source(kubeconfig=(str(plugin.kubeconfig),)))
        try:
            await api.list(models_ref("default"))
            # The server stops accepting token-1 (it expired, or was revoked); the plugin
            # now hands out token-2.
            plugin.issue("token-2")
            guarded.sandbox.accept_tokens("admin", "token-2")
            await api.list(models_ref("default"))
            await api.list(models_ref("default"))
            return api.logins, plugin.runs
        finally:
            await api.aclose()

    logins, runs = asyncio.run(scenario())
    seen = guarded.sandbox.tokens_seen()
    assert seen.get("token-1", 0) == 2  # one accepted, one refused
    assert seen.get("token-2", 0) == 2  # the retry, and the next call
    assert (logins, runs) == (2, 2)  # one login more, not one per call


def test_a_credential_is_renewed_before_it_expires(guarded: Cluster, tmp_path: Path) -> None:
    """An exec credential says when it expires: a fresh one is fetched before then, not after
    a refusal."""
    from snooze.api.times import format_time

    plugin = Plugin(tmp_path, guarded.sandbox.url)
    guarded.sandbox.accept_tokens("admin", "token-1", "token-2")
    (plugin.dir / "expiry").write_text(format_time(time.time() + 5))  # within the margin

    async def scenario() -> int:
        api = KubeApi(Source(kubeconfig=(str(plugin.kubeconfig),)))
        try:
            plugin.issue("token-2")
            (plugin.dir / "expiry").write_text(format_time(time.time() + 3600))
            await api.list(models_ref("default"))
            await api.list(models_ref("default"))
            return api.logins
        finally:
            await api.aclose()

    assert asyncio.run(scenario()) == 2
    seen = guarded.sandbox.tokens_seen()
    assert seen.get("token-1", 0) == 0 and seen.get("token-2", 0) == 2  # never sent expired


def test_a_token_refused_after_a_fresh_login_is_an_error(guarded: Cluster, tmp_path: Path) -> None:
    from snooze.kube.api import KubeError

    plugin = Plugin(tmp_path, guarded.sandbox.url)

    async def scenario() -> str:
        api = KubeApi(Source(kubeconfig=(str(plugin.kubeconfig),)))
        try:
            await api.list(models_ref("default"))
        except KubeError as exc:
            return str(exc)
        finally:
            await api.aclose()
        return "no error"

    message = asyncio.run(scenario())
    assert "refuses the credentials" in message and str(plugin.kubeconfig) in message
    assert plugin.runs == 2  # logged in once more, then gave up


def test_the_operator_logs_in_with_an_exec_plugin(guarded: Cluster, tmp_path: Path) -> None:
    plugin = Plugin(tmp_path, guarded.sandbox.url)
    guarded.sandbox.accept_tokens("admin", "token-1")
    guarded.create_pod("chat-0", labels=LABELS)
    guarded.create_model("chat", {"selector": {"matchLabels": LABELS}, "idle": {"after": "1h"}})
    operator = Process(
        tmp_path / "operator.log",
        "operator",
        "--kubeconfig",
        str(plugin.kubeconfig),
        "--probe-interval",
        "0.2",
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},  # no KUBECONFIG to fall back on
    )
    try:
        wait_for("served", lambda: guarded.status("chat").get("phase") == "Awake", timeout=30)
        assert guarded.sandbox.tokens_seen().get("token-1", 0) > 0
        # token-1 stops working: the operator's next API calls are refused, it runs the
        # plugin again, and carries on with token-2.
        plugin.issue("token-2")
        guarded.sandbox.accept_tokens("admin", "token-2")
        guarded.patch_model("chat", {"spec": {"desiredState": "Asleep"}})
        wait_for("asleep", lambda: guarded.pod_state("chat-0") == "asleep", timeout=30)
        wait_for("phase Asleep", lambda: guarded.status("chat").get("phase") == "Asleep")
        assert guarded.sandbox.tokens_seen().get("token-2", 0) > 0
        assert "logged in to the Kubernetes API again" in operator.output()
    finally:
        assert operator.stop() == 0, operator.output()[-3000:]
    assert "Traceback" not in operator.output()


def test_the_gateway_logs_in_with_an_exec_plugin(guarded: Cluster, tmp_path: Path) -> None:
    plugin = Plugin(tmp_path, guarded.sandbox.url)
    guarded.sandbox.accept_tokens("admin", "token-1")
    guarded.create_model("chat", {"selector": {"matchLabels": LABELS}})
    port = free_port()
    gateway = Process(
        tmp_path / "gateway.log",
        "gateway",
        "--kubeconfig",
        str(plugin.kubeconfig),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    try:

        def listed() -> bool:
            try:
                models = httpx.get(f"http://127.0.0.1:{port}/v1/models").json()
            except httpx.HTTPError:
                return False
            return [m["id"] for m in models.get("data", [])] == ["chat"]

        wait_for("the model listed", listed, timeout=30)
    finally:
        gateway.stop()
    assert guarded.sandbox.tokens_seen().get("token-1", 0) > 0
    # Its API calls are debug chatter: nothing per request at the default level.
    assert "HTTP Request:" not in gateway.output()
    assert "API GET" not in gateway.output()


def test_context_picks_the_cluster(cluster: Cluster, tmp_path: Path) -> None:
    path = tmp_path / "two-clusters"
    config = kubeconfig(cluster.sandbox.url, user={"token": "t"}, current="elsewhere")
    path.write_text(yaml.safe_dump(config))
    cluster.create_pod("chat-0", labels=LABELS)
    cluster.create_model("chat", {"selector": {"matchLabels": LABELS}})
    operator = Process(
        tmp_path / "operator.log",
        "operator",
        "--kubeconfig",
        str(path),
        "--context",
        "sandbox",
        "--probe-interval",
        "0.2",
    )
    try:
        wait_for("served", lambda: cluster.status("chat").get("phase") == "Awake", timeout=30)
    finally:
        assert operator.stop() == 0, operator.output()[-3000:]
