"""The Kubernetes client over TLS, as a real API server is reached: the cluster's CA from the
kubeconfig, a client certificate or a token, and a clear refusal of a server the CA did not
sign. The server here is a TLS endpoint that records who called (certificates made with
openssl for each test)."""

from __future__ import annotations

import ssl
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from snooze.kube.api import KubeApi, KubeError, pods_ref
from snooze.kube.credentials import Source

pytestmark = pytest.mark.needs("openssl")


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_ca(where: Path, name: str) -> None:
    openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "1", "-subj", f"/CN={name}",
        cwd=where,
    )  # fmt: skip


def make_cert(where: Path, name: str, *, ca: str, extensions: str = "") -> None:
    openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}",
        cwd=where,
    )  # fmt: skip
    (where / f"{name}.ext").write_text(extensions)
    openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
        "-CAcreateserial", "-out", f"{name}.crt", "-days", "1", "-extfile", f"{name}.ext",
        cwd=where,
    )  # fmt: skip


@dataclass
class Seen:
    """What the API server saw of each call."""

    clients: list[str | None] = field(default_factory=list)
    """The common name of the client's certificate, None without one."""
    tokens: list[str | None] = field(default_factory=list)


@dataclass
class Server:
    url: str
    certs: Path
    seen: Seen


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Server]:
    """An API endpoint over TLS (its certificate for 127.0.0.1 signed by `cluster-ca`) that
    accepts client certificates signed by the same CA, and lists no pods."""
    make_ca(tmp_path, "cluster-ca")
    make_cert(tmp_path, "apiserver", ca="cluster-ca", extensions="subjectAltName=IP:127.0.0.1\n")
    make_cert(tmp_path, "snooze-operator", ca="cluster-ca")
    make_ca(tmp_path, "other-ca")
    seen = Seen()

    async def pods(request: web.Request) -> web.Response:
        peer: Any = request.transport.get_extra_info("peercert") if request.transport else None
        subject = dict(pair[0] for pair in peer["subject"]) if peer else {}
        seen.clients.append(subject.get("commonName"))
        seen.tokens.append(request.headers.get("Authorization"))
        return web.json_response({"kind": "PodList", "items": [], "metadata": {}})

    app = web.Application()
    app.router.add_get("/api/v1/namespaces/default/pods", pods)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tmp_path / "apiserver.crt", tmp_path / "apiserver.key")
    context.load_verify_locations(tmp_path / "cluster-ca.crt")
    context.verify_mode = ssl.CERT_OPTIONAL  # a token alone is enough too
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield Server(f"https://127.0.0.1:{port}", tmp_path, seen)
    finally:
        await runner.cleanup()


def api_for(tmp: Path, cluster: dict[str, Any], user: dict[str, Any]) -> KubeApi:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path = tmp / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return KubeApi(Source(kubeconfig=(str(path),)), timeout=5)


async def test_a_client_certificate_signed_by_the_cluster_ca(server: Server) -> None:
    certs = server.certs
    api = api_for(
        certs,
        {"server": server.url, "certificate-authority": str(certs / "cluster-ca.crt")},
        {
            "client-certificate": str(certs / "snooze-operator.crt"),
            "client-key": str(certs / "snooze-operator.key"),
        },
    )
    try:
        assert (await api.list(pods_ref("default")))["items"] == []
        assert (await api.list(pods_ref("default")))["items"] == []
    finally:
        await api.aclose()
    assert server.seen.clients == ["snooze-operator", "snooze-operator"]


async def test_a_token_over_tls(server: Server) -> None:
    certs = server.certs
    api = api_for(
        certs,
        {"server": server.url, "certificate-authority": str(certs / "cluster-ca.crt")},
        {"token": "s3cret"},
    )
    try:
        await api.list(pods_ref("default"))
    finally:
        await api.aclose()
    assert server.seen.tokens == ["Bearer s3cret"]
    assert server.seen.clients == [None]


async def test_a_server_the_ca_did_not_sign_is_refused(server: Server) -> None:
    certs = server.certs
    api = api_for(
        certs,
        {"server": server.url, "certificate-authority": str(certs / "other-ca.crt")},
        {"token": "s3cret"},
    )
    api_errors = pytest.raises(KubeError, match=r"(?s)verify failed.*certificate-authority")
    try:
        with api_errors:
            await api.list(pods_ref("default"))
    finally:
        await api.aclose()
    assert server.seen.tokens == []  # the token never left the client


async def test_insecure_skip_tls_verify(server: Server) -> None:
    api = api_for(
        server.certs, {"server": server.url, "insecure-skip-tls-verify": True}, {"token": "t"}
    )
    try:
        await api.list(pods_ref("default"))
    finally:
        await api.aclose()
    assert server.seen.tokens == ["Bearer t"]
