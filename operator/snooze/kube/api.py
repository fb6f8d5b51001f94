"""A small async Kubernetes API client over httpx, with the credentials kubectl would use.

The operator and the gateway need a handful of calls (patch a pod's labels, delete a pod,
patch a status, annotate a model, list and watch). kopf's own client is private, and the
`kubernetes` package is synchronous, so this module speaks the REST API directly over a
tuned transport, with the credentials that `credentials.py` reads through the `kubernetes`
library (and reads again when they expire or the API answers 401).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import kopf

from snooze import models
from snooze.kube import credentials
from snooze.kube.credentials import Login, Source
from snooze.kube.transport import BoundedTransport

JSON = dict[str, Any]
log = logging.getLogger(__name__)

# Transient answers, retried with backoff: conflicts (another writer won), throttling,
# and the server's own troubles. Everything else is the caller's mistake and is raised.
RETRIABLE = {409, 429, 500, 502, 503, 504}
BACKOFF = (0.1, 0.3, 1.0, 2.0, 4.0)
MERGE_PATCH = "application/merge-patch+json"
EXPIRED = "the credential expired"


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


def _ssl_context(login: Login) -> ssl.SSLContext | bool:
    if login.insecure:
        return False
    context = ssl.create_default_context()
    if login.ca_path:
        context.load_verify_locations(cafile=login.ca_path)
    if login.cert_path:
        context.load_cert_chain(login.cert_path, login.key_path)
    return context


def login() -> kopf.ConnectionInfo:
    """kopf's login: the process's credentials (credentials.default()), logged in now."""
    return credentials.default().login().connection_info()


class KubeApi:
    """The API calls Snooze makes, each retried on transient errors, logged in again when the
    login expires or the API refuses it (401)."""

    def __init__(self, source: Source, *, timeout: float = 10.0) -> None:
        self.source = source
        self.timeout = timeout
        self._login = source.login()
        self._client = self._new_client(self._login)
        self._renewal = asyncio.Lock()
        self._retired: list[httpx.AsyncClient] = []
        self.logins = 1
        """How many times this client logged in (tests read it)."""

    def _new_client(self, login: Login) -> httpx.AsyncClient:
        headers = {"Accept": "application/json"}
        if login.authorization:
            headers["Authorization"] = login.authorization
        # A watch holds its slot while it streams: the gateway keeps two per namespace. The
        # pool itself is looser, so that requests never queue inside httpcore (see engine.py).
        slots = 100
        limits = httpx.Limits(max_connections=4 * slots, max_keepalive_connections=20)
        inner = httpx.AsyncHTTPTransport(
            verify=_ssl_context(login), limits=limits, proxy=login.proxy
        )
        return httpx.AsyncClient(
            base_url=login.server,
            headers=headers,
            # A thousand models writing at once queue in O(1) here, not in httpcore's pool.
            transport=BoundedTransport(inner, slots),
            timeout=self.timeout,
        )

    @property
    def server(self) -> str:
        return self._login.server

    @classmethod
    def from_environment(cls) -> KubeApi:
        """Logged in with the process's credentials (the command line's, or the environment's)."""
        return cls(credentials.default())

    async def aclose(self) -> None:
        for client in (*self._retired, self._client):
            await client.aclose()

    async def _renew(self, refused: Login, *, why: str = "the API refused it") -> None:
        """Log in again, unless another call did since `refused` was used. An exec plugin may
        take seconds: it runs in a thread, not in the event loop."""
        async with self._renewal:
            if self._login is not refused:
                return
            login = await asyncio.to_thread(self.source.login)
            old, self._login = self._client, login
            self.logins += 1
            same_tls = (login.ca_path, login.cert_path, login.key_path, login.insecure) == (
                refused.ca_path,
                refused.cert_path,
                refused.key_path,
                refused.insecure,
            )
            if same_tls and login.server == refused.server and login.proxy == refused.proxy:
                if login.authorization:
                    self._client.headers["Authorization"] = login.authorization
                else:
                    self._client.headers.pop("Authorization", None)
            else:
                # New client certificates (an exec plugin may rotate them): a new pool; the
                # old one ends once the calls that use it do.
                self._client = self._new_client(login)
                asyncio.get_running_loop().call_later(
                    60, lambda: asyncio.ensure_future(old.aclose())
                )
            # A refusal is news; a credential renewed before it expired is routine.
            level = logging.DEBUG if why == EXPIRED else logging.INFO
            log.log(
                level,
                "logged in to the Kubernetes API again, as %s (%s)",
                why,
                self.source.describe(),
            )

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
        renewed = False
        for delay in (*BACKOFF, None):
            login = self._login
            if login.expired():
                await self._renew(login, why=EXPIRED)
                login = self._login
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
                if response.status_code == 401 and not renewed:
                    # Expired or revoked: log in once more (an exec plugin gives a fresh
                    # token), then try again at once.
                    renewed = True
                    await self._renew(login)
                    continue
                if response.status_code == 401:
                    raise KubeError(
                        f"{method} {path}: {message}: the API refuses the credentials of "
                        f"{self.source.describe()}, even after a fresh login",
                        status=401,
                    )
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
        login = self._login
        if login.expired():
            await self._renew(login, why=EXPIRED)
            login = self._login
        async with self._client.stream("GET", ref.path, params=params, timeout=timeout) as response:
            if response.status_code >= 300:
                await response.aread()
                if response.status_code == 401:
                    await self._renew(login)  # the caller's next attempt uses the new one
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
