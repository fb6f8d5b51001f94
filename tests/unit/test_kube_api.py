"""The Kubernetes client as a real API server meets it: over TLS (the cluster's CA from the
kubeconfig, a client certificate or a token, a clear refusal of a server that CA did not sign;
certificates made with openssl for each test), and with timeouts that bound silence, not size
(a long answer that keeps coming is read whole, a silent server is given up on and retried,
calls queued behind others are not timed out by the queue)."""

from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from snooze.kube import api as kube_api
from snooze.kube.api import KubeApi, KubeError, pods_ref
from snooze.kube.credentials import Source


def api_for(tmp: Path, cluster: dict[str, Any], user: dict[str, Any], **options: Any) -> KubeApi:
    """A client of `cluster` as `user`, through a kubeconfig written in `tmp`."""
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
    return KubeApi(Source(kubeconfig=(str(path),)), **options)


# ---------------------------------------------------------------------------------------------
# TLS

needs_openssl = pytest.mark.needs("openssl")


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
async def tls_server(tmp_path: Path) -> AsyncIterator[Server]:
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


@needs_openssl
async def test_a_client_certificate_signed_by_the_cluster_ca(tls_server: Server) -> None:
    certs = tls_server.certs
    api = api_for(
        certs,
        {"server": tls_server.url, "certificate-authority": str(certs / "cluster-ca.crt")},
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
    assert tls_server.seen.clients == ["snooze-operator", "snooze-operator"]


def token_api(server: Server, ca: str) -> KubeApi:
    """A client with a token, trusting the CA named `ca` (made by the `tls_server` fixture)."""
    cluster = {"server": server.url, "certificate-authority": str(server.certs / f"{ca}.crt")}
    return api_for(server.certs, cluster, {"token": "s3cret"}, timeout=5)


@needs_openssl
async def test_a_token_over_tls(tls_server: Server) -> None:
    api = token_api(tls_server, "cluster-ca")
    try:
        await api.list(pods_ref("default"))
    finally:
        await api.aclose()
    assert tls_server.seen.tokens == ["Bearer s3cret"]
    assert tls_server.seen.clients == [None]


@needs_openssl
async def test_a_server_the_ca_did_not_sign_is_refused(tls_server: Server) -> None:
    api = token_api(tls_server, "other-ca")
    api_errors = pytest.raises(KubeError, match=r"(?s)verify failed.*certificate-authority")
    try:
        with api_errors:
            await api.list(pods_ref("default"))
    finally:
        await api.aclose()
    assert tls_server.seen.tokens == []  # the token never left the client


@needs_openssl
async def test_insecure_skip_tls_verify(tls_server: Server) -> None:
    api = api_for(
        tls_server.certs,
        {"server": tls_server.url, "insecure-skip-tls-verify": True},
        {"token": "t"},
    )
    try:
        await api.list(pods_ref("default"))
    finally:
        await api.aclose()
    assert tls_server.seen.tokens == ["Bearer t"]


# ---------------------------------------------------------------------------------------------
# Timeouts

TIMEOUT = 0.5


@pytest.fixture
async def timing_server() -> AsyncIterator[tuple[str, dict[str, int]]]:
    """`/slow`: a pod list sent in pieces, 0.3 s apart, 1.2 s in all; `/silent`: no answer for
    2 s; `/quick`: a list after 0.2 s. Counts the calls to each."""
    calls = {"slow": 0, "silent": 0, "quick": 0}

    async def slow(request: web.Request) -> web.StreamResponse:
        calls["slow"] += 1
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        body = json.dumps({"items": [{"metadata": {"name": f"pod-{i}"}} for i in range(4000)]})
        piece = len(body) // 4 + 1
        for start in range(0, len(body), piece):
            # The stand-in's pace, not a wait: a list that drips in over more than a second.
            await asyncio.sleep(0.3)
            await response.write(body[start : start + piece].encode())
        await response.write_eof()
        return response

    async def silent(request: web.Request) -> web.Response:
        calls["silent"] += 1
        # The stand-in's silence, not a wait: it answers later than the client waits.
        await asyncio.sleep(2)
        return web.json_response({"items": []})

    async def quick(request: web.Request) -> web.Response:
        calls["quick"] += 1
        # The stand-in's pace, not a wait: a slow answer that still comes in time.
        await asyncio.sleep(0.2)
        return web.json_response({"items": []})

    app = web.Application()
    app.router.add_get("/api/v1/namespaces/slow/pods", slow)
    app.router.add_get("/api/v1/namespaces/silent/pods", silent)
    app.router.add_get("/api/v1/namespaces/quick/pods", quick)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", calls
    finally:
        await runner.cleanup()


def plain_api(tmp: Path, url: str, **options: Any) -> KubeApi:
    return api_for(tmp, {"server": url}, {"token": "t"}, **options)


async def test_a_long_answer_that_keeps_coming_is_read_whole(
    timing_server: tuple[str, dict[str, int]], tmp_path: Path
) -> None:
    url, calls = timing_server
    api = plain_api(tmp_path, url, timeout=TIMEOUT)
    try:
        listing = await api.list(pods_ref("slow"))
    finally:
        await api.aclose()
    assert len(listing["items"]) == 4000
    assert calls["slow"] == 1  # not timed out and retried


async def test_a_silent_server_is_given_up_on_and_retried(
    timing_server: tuple[str, dict[str, int]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kube_api, "BACKOFF", (0.0,))
    url, calls = timing_server
    api = plain_api(tmp_path, url, timeout=TIMEOUT)
    try:
        with pytest.raises(KubeError, match=r"kept failing: .*Timeout"):
            await api.list(pods_ref("silent"))
    finally:
        await api.aclose()
    assert calls["silent"] == 2  # the call and its one retry


async def test_calls_waiting_for_a_slot_are_not_timed_out_by_the_wait(
    timing_server: tuple[str, dict[str, int]], tmp_path: Path
) -> None:
    """Eight calls of 0.2 s through one slot: the last waits 1.4 s, beyond the timeout."""
    url, calls = timing_server
    api = plain_api(tmp_path, url, timeout=TIMEOUT, slots=1)
    try:
        answers = await asyncio.gather(*(api.list(pods_ref("quick")) for _ in range(8)))
    finally:
        await api.aclose()
    assert answers == [{"items": []}] * 8
    assert calls["quick"] == 8  # none retried


# ---------------------------------------------------------------------------------------------
# Headers of the caller's


async def test_a_callers_headers_go_with_the_logins(tmp_path: Path) -> None:
    """Impersonation, say: the caller's headers are sent beside the login's own, which they do
    not replace."""
    seen: list[dict[str, str]] = []

    async def review(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        return web.json_response({"status": {"allowed": True}}, status=201)

    app = web.Application()
    app.router.add_post("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", review)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    api = plain_api(tmp_path, f"http://127.0.0.1:{runner.addresses[0][1]}")
    try:
        path = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
        as_operator = {"Impersonate-User": "system:serviceaccount:snooze:snooze-operator"}
        answer = await api.request("POST", path, body={}, headers=as_operator)
        await api.request("POST", path, body={})
    finally:
        await api.aclose()
        await runner.cleanup()
    assert answer == {"status": {"allowed": True}}
    assert seen[0]["Impersonate-User"] == "system:serviceaccount:snooze:snooze-operator"
    assert seen[0]["Authorization"] == "Bearer t"
    assert "Impersonate-User" not in seen[1]  # only the call that asked
