"""A small async Kubernetes API client over httpx, logged in the way kopf logs in.

The operator and the gateway need a handful of calls (patch a pod's labels, delete a pod,
patch a status, annotate a model, list and watch). kopf's own client is private, and the
`kubernetes` package is synchronous, so this module speaks the REST API directly, with
the credentials that kopf's login functions read from the kubeconfig or service account.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import ssl
import tempfile
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import kopf

from snooze import models
from snooze.kube.transport import BoundedTransport

JSON = dict[str, Any]
log = logging.getLogger(__name__)

# Transient answers, retried with backoff: conflicts (another writer won), throttling,
# and the server's own troubles. Everything else is the caller's mistake and is raised.
RETRIABLE = {409, 429, 500, 502, 503, 504}
BACKOFF = (0.1, 0.3, 1.0, 2.0, 4.0)
MERGE_PATCH = "application/merge-patch+json"


class KubeError(Exception):
    """The API refused a call, or kept failing after retries."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class NotFound(KubeError):
    """The object is gone (HTTP 404)."""


@dataclass(frozen=True)
class Ref:
    """Where an object lives in the API."""

    path: str
    """The collection path, such as `/api/v1/namespaces/ns/pods`."""

    def item(self, name: str, sub: str = "") -> str:
        return f"{self.path}/{name}" + (f"/{sub}" if sub else "")


def pods_ref(namespace: str | None) -> Ref:
    return Ref("/api/v1/pods" if namespace is None else f"/api/v1/namespaces/{namespace}/pods")


def models_ref(namespace: str | None) -> Ref:
    base = f"/apis/{models.GROUP}/{models.VERSION}"
    where = "" if namespace is None else f"/namespaces/{namespace}"
    return Ref(f"{base}{where}/{models.PLURAL}")


def _ssl_context(info: kopf.ConnectionInfo) -> ssl.SSLContext | bool:
    if info.insecure:
        return False
    context = ssl.create_default_context()
    if info.ca_path:
        context.load_verify_locations(cafile=str(info.ca_path))
    elif info.ca_data:
        data = info.ca_data.decode() if isinstance(info.ca_data, bytes) else info.ca_data
        context.load_verify_locations(cadata=data)
    cert, key = info.certificate_path, info.private_key_path
    if info.certificate_data and info.private_key_data:
        # ssl takes client certificates from files only.
        cert = _temp_file(info.certificate_data)
        key = _temp_file(info.private_key_data)
    if cert:
        context.load_cert_chain(str(cert), str(key) if key else None)
    return context


def _temp_file(data: str | bytes) -> str:
    with tempfile.NamedTemporaryFile("wb", delete=False, suffix=".pem") as handle:
        handle.write(data.encode() if isinstance(data, str) else data)
        return handle.name


def login() -> kopf.ConnectionInfo:
    """Credentials as kopf finds them: the kubernetes client's config, a service account,
    or the kubeconfig (KUBECONFIG or ~/.kube/config)."""
    logger = logging.getLogger("snooze.login")
    attempts = [kopf.login_with_service_account, kopf.login_via_client, kopf.login_with_kubeconfig]
    if os.environ.get("KUBECONFIG"):
        # An explicit KUBECONFIG wins, read now: the kubernetes client reads it once at import.
        attempts.insert(0, kopf.login_with_kubeconfig)
    for attempt in attempts:
        try:
            info = attempt(logger=logger, settings=kopf.OperatorSettings())
        except Exception as exc:  # each method fails in its own way when it does not apply
            log.debug("login via %s did not apply: %s", attempt.__name__, exc)
            continue
        if info is not None:
            return info
    raise KubeError(
        "no Kubernetes credentials found: set KUBECONFIG (for example to the file that "
        "`snooze sandbox --kubeconfig FILE` writes), or run in a pod with a service account"
    )


class KubeApi:
    """The API calls Snooze makes, each retried on transient errors."""

    def __init__(self, info: kopf.ConnectionInfo, *, timeout: float = 10.0) -> None:
        headers = dict(info.as_http_headers())
        headers["Accept"] = "application/json"
        self.server = info.server.rstrip("/")
        # A watch holds its slot while it streams: the gateway keeps two per namespace. The
        # pool itself is looser, so that requests never queue inside httpcore (see engine.py).
        slots = 100
        limits = httpx.Limits(max_connections=4 * slots, max_keepalive_connections=20)
        inner = httpx.AsyncHTTPTransport(verify=_ssl_context(info), limits=limits)
        self._client = httpx.AsyncClient(
            base_url=self.server,
            headers=headers,
            # A thousand models writing at once queue in O(1) here, not in httpcore's pool.
            transport=BoundedTransport(inner, slots),
            timeout=timeout,
        )

    @classmethod
    def from_environment(cls) -> KubeApi:
        return cls(login())

    async def aclose(self) -> None:
        await self._client.aclose()

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> JSON:
        """One call, retried on transient failures; the decoded answer."""
        content = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": content_type} if content is not None else {}
        last = ""
        for delay in (*BACKOFF, None):
            try:
                response = await self._client.request(
                    method, path, content=content, headers=headers, params=params
                )
            except httpx.TransportError as exc:
                last = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code < 300:
                    return response.json() if response.content else {}
                message = _status_message(response)
                if response.status_code == 404:
                    raise NotFound(f"{method} {path}: {message}", status=404)
                if response.status_code not in RETRIABLE:
                    raise KubeError(f"{method} {path}: {message}", status=response.status_code)
                last = f"HTTP {response.status_code}: {message}"
            if delay is None:
                break
            log.debug("%s %s failed (%s); retrying in %ss", method, path, last, delay)
            await asyncio.sleep(delay)
        raise KubeError(f"{method} {path} kept failing: {last}")

    async def serves(self, group: str, version: str, plural: str) -> bool:
        """Whether the API serves a resource now, from discovery (readable by every client)."""
        try:
            found = await self.request("GET", f"/apis/{group}/{version}")
        except NotFound:
            return False
        return any(r.get("name") == plural for r in found.get("resources") or [])

    async def patch(self, ref: Ref, name: str, body: JSON, *, sub: str = "") -> JSON:
        return await self.request("PATCH", ref.item(name, sub), body=body, content_type=MERGE_PATCH)

    async def get(self, ref: Ref, name: str) -> JSON:
        return await self.request("GET", ref.item(name))

    async def delete(self, ref: Ref, name: str) -> None:
        with contextlib.suppress(NotFound):  # already gone: what we wanted
            await self.request("DELETE", ref.item(name))

    async def list(self, ref: Ref, *, label_selector: str = "") -> JSON:
        params = {"labelSelector": label_selector} if label_selector else None
        return await self.request("GET", ref.path, params=params)

    async def watch(
        self, ref: Ref, *, resource_version: str, timeout_seconds: int = 300
    ) -> AsyncIterator[JSON]:
        """Watch events after `resource_version`, until the server ends the stream."""
        params = {
            "watch": "true",
            "resourceVersion": resource_version,
            "timeoutSeconds": str(timeout_seconds),
            "allowWatchBookmarks": "true",
        }
        timeout = httpx.Timeout(10.0, read=timeout_seconds + 30.0)
        async with self._client.stream("GET", ref.path, params=params, timeout=timeout) as response:
            if response.status_code >= 300:
                await response.aread()
                raise KubeError(
                    f"watch {ref.path}: {_status_message(response)}", status=response.status_code
                )
            async for line in response.aiter_lines():
                if line.strip():
                    yield json.loads(line)


def _status_message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:300] or f"HTTP {response.status_code}"
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    return f"HTTP {response.status_code}"
