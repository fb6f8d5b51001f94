"""A small async Kubernetes API client over aiohttp, with the credentials kubectl would use.

The operator and the gateway need a handful of calls (patch a pod's labels, delete a pod,
patch a status, annotate a model, list and watch). kopf's own client is private, and the
`kubernetes` package is synchronous, so this module speaks the REST API directly, with the
credentials that `credentials.py` reads through the `kubernetes` library (and reads again
when they expire or the API answers 401). aiohttp (kopf's own HTTP client) keeps its pooled
connections per host and hands one out in O(1): at thousands of models the operator's writes
come in bursts of thousands, each of which opened a connection of its own through httpx.
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

import aiohttp
import kopf

from snooze.api import models
from snooze.kube import credentials
from snooze.kube.credentials import Login, Source
from snooze.kube.writes import FairWrites, is_urgent, namespace_of

JSON = dict[str, Any]
log = logging.getLogger(__name__)

# Transient answers, retried with backoff: conflicts (another writer won), throttling,
# and the server's own troubles. Everything else is the caller's mistake and is raised.
RETRIABLE = {409, 429, 500, 502, 503, 504}
BACKOFF = (0.1, 0.3, 1.0, 2.0, 4.0)
MERGE_PATCH = "application/merge-patch+json"
# Merges lists by their key (a pod's conditions by type): the only patch that changes one pod
# condition without rewriting the kubelet's.
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
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

    def __init__(
        self,
        source: Source,
        *,
        timeout: float = 10.0,
        slots: int = 100,
        writes: FairWrites | None = None,
    ) -> None:
        self.source = source
        self.writes = writes
        """Turns for this client's writes, shared fairly between namespaces (None: none)."""
        self.timeout = timeout
        """Seconds a call may take to connect, and to wait for each part of its answer; counted
        once it has its slot (not while it queues)."""
        self.slots = slots
        """Calls at once (watches apart): the others queue here, in order."""
        self._login = source.login()
        self._renewal = asyncio.Lock()
        self._session: aiohttp.ClientSession | None = None
        self._bound: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._retired: list[aiohttp.ClientSession] = []
        self.logins = 1
        """How many times this client logged in (tests read it)."""

    def _client(self) -> tuple[aiohttp.ClientSession, asyncio.Semaphore]:
        """The session and the call slots of the running event loop (made at first use: an
        aiohttp session belongs to one loop)."""
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or loop is not self._loop:
            self._session, self._loop = self._new_session(self._login), loop
            self._bound = asyncio.Semaphore(self.slots)
        assert self._bound is not None
        return self._session, self._bound

    @staticmethod
    def _new_session(login: Login) -> aiohttp.ClientSession:
        # No connection limit here: the slots bound the calls, and a watch (which holds its
        # connection while it streams) must never wait behind them.
        connector = aiohttp.TCPConnector(limit=0, ssl=_ssl_context(login))
        return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None))

    def _headers(self, login: Login, content_type: str | None = None) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if login.authorization:
            headers["Authorization"] = login.authorization
        if content_type is not None:
            headers["Content-Type"] = content_type
        return headers

    @staticmethod
    def _url(login: Login, path: str) -> str:
        # The server may have a path of its own (an API behind a proxy): joined, not replaced.
        return login.server.rstrip("/") + path

    @property
    def server(self) -> str:
        return self._login.server

    @classmethod
    def from_environment(cls, *, writes: FairWrites | None = None) -> KubeApi:
        """Logged in with the process's credentials (the command line's, or the environment's)."""
        return cls(credentials.default(), writes=writes)

    async def aclose(self) -> None:
        for session in (*self._retired, self._session):
            if session is not None and not session.closed:
                await session.close()

    async def _close_retired(self, session: aiohttp.ClientSession) -> None:
        await session.close()
        self._retired.remove(session)

    async def _renew(self, refused: Login, *, why: str = "the API refused it") -> None:
        """Log in again, unless another call did since `refused` was used. An exec plugin may
        take seconds: it runs in a thread, not in the event loop."""
        async with self._renewal:
            if self._login is not refused:
                return
            login = await asyncio.to_thread(self.source.login)
            self._login = login
            self.logins += 1
            same_tls = (login.ca_path, login.cert_path, login.key_path, login.insecure) == (
                refused.ca_path,
                refused.cert_path,
                refused.key_path,
                refused.insecure,
            )
            old = self._session
            if not same_tls and old is not None:
                # New client certificates (an exec plugin may rotate them): a new pool. The
                # old one is closed a minute later, once the calls on it have ended (a watch
                # still on it is cut, and its caller watches again on the new one). The token,
                # the server and the proxy are read at each call.
                self._session = self._new_session(login)
                self._retired.append(old)
                asyncio.get_running_loop().call_later(
                    60, lambda: asyncio.ensure_future(self._close_retired(old))
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
        retry: bool = True,
        headers: Mapping[str, str] | None = None,
        yield_to: asyncio.Event | None = None,
    ) -> JSON:
        """One call, retried on transient failures (unless not `retry`); the decoded answer.
        `headers` are sent besides the login's (impersonation, say). A write waits for its turn
        first, when this client shares its writes (writes.py), and gives way (WriteYielded) if
        `yield_to` is set before its turn comes."""
        if self.writes is None or method not in WRITE_METHODS:
            return await self._request(method, path, body, params, content_type, retry, headers)
        turn = self.writes.turn(namespace_of(path), urgent=is_urgent(), yield_to=yield_to)
        async with turn:
            return await self._request(method, path, body, params, content_type, retry, headers)

    async def _request(
        self,
        method: str,
        path: str,
        body: Any,
        params: Mapping[str, str] | None,
        content_type: str,
        retry: bool,
        headers: Mapping[str, str] | None,
    ) -> JSON:
        content = None if body is None else json.dumps(body).encode()
        last, last_status = "", None
        renewed = False
        pauses = iter(BACKOFF if retry else ())
        while True:
            login = self._login
            if login.expired():
                await self._renew(login, why=EXPIRED)
                login = self._login
            try:
                status, answer = await self._call(
                    login,
                    method,
                    path,
                    content=content,
                    params=params,
                    content_type=None if content is None else content_type,
                    headers=headers,
                )
            except aiohttp.ClientConnectorCertificateError as exc:
                # Not transient: no retry makes the certificate valid.
                raise KubeError(
                    f"{method} {path}: the API server {login.server} presented a certificate "
                    f"that cannot be verified ({exc.certificate_error}); check the cluster's "
                    f"certificate-authority in {self.source.describe()}"
                ) from None
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                why = str(exc) or (
                    f"no answer within {self.timeout:g}s" if isinstance(exc, TimeoutError) else ""
                )
                last = f"{type(exc).__name__}: {why}" if why else type(exc).__name__
                last_status = None
            else:
                if status < 300:
                    return json.loads(answer) if answer else {}
                message = _status_message(status, answer)
                if status == 401 and retry and not renewed:
                    # Expired or revoked: log in once more (an exec plugin gives a fresh
                    # token), then try again at once.
                    renewed = True
                    await self._renew(login)
                    continue
                if status == 401:
                    after = ", even after a fresh login" if renewed else ""
                    raise KubeError(
                        f"{method} {path}: {message}: the API refuses the credentials of "
                        f"{self.source.describe()}{after}",
                        status=401,
                    )
                if status == 404:
                    raise NotFound(f"{method} {path}: {message}", status=404)
                if status not in RETRIABLE:
                    raise KubeError(f"{method} {path}: {message}", status=status)
                last, last_status = f"HTTP {status}: {message}", status
            delay = next(pauses, None)
            if delay is None:
                break
            log.debug("%s %s failed (%s); retrying in %ss", method, path, last, delay)
            await asyncio.sleep(delay)
        failed = "kept failing" if retry else "failed"
        raise KubeError(f"{method} {path} {failed}: {last}", status=last_status)

    async def _call(
        self,
        login: Login,
        method: str,
        path: str,
        *,
        content: bytes | None,
        params: Mapping[str, str] | None,
        content_type: str | None,
        headers: Mapping[str, str] | None = None,
    ) -> tuple[int, bytes]:
        """One attempt: the status and the body. Its timeouts start once it has its slot: a
        burst of thousands of writes queues here for seconds, and that is this process's
        delay, not the server's. They bound the connection and each wait for data, not the
        whole answer: a list of ten thousand pods takes longer, and is not stuck."""
        session, bound = self._client()
        timeout = aiohttp.ClientTimeout(total=None, connect=self.timeout, sock_read=self.timeout)
        async with (
            bound,
            session.request(
                method,
                self._url(login, path),
                data=content,
                params=params,
                headers={**self._headers(login, content_type), **(headers or {})},
                proxy=login.proxy,
                timeout=timeout,
            ) as response,
        ):
            answer = await response.read()
        log.debug("API %s %s: HTTP %d", method, path, response.status)
        return response.status, answer

    async def serves(self, group: str, version: str, plural: str) -> bool:
        """Whether the API serves a resource now, from discovery (readable by every client)."""
        try:
            found = await self.request("GET", f"/apis/{group}/{version}")
        except NotFound:
            return False
        return any(r.get("name") == plural for r in found.get("resources") or [])

    async def patch(
        self,
        ref: Ref,
        name: str,
        body: JSON,
        *,
        sub: str = "",
        yield_to: asyncio.Event | None = None,
    ) -> JSON:
        return await self.request(
            "PATCH", ref.item(name, sub), body=body, content_type=MERGE_PATCH, yield_to=yield_to
        )

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
        # No deadline for the whole stream (it lasts up to timeoutSeconds), but one for the
        # connection and for silence between events (the server sends bookmarks).
        timeout = aiohttp.ClientTimeout(
            total=None, connect=self.timeout, sock_read=timeout_seconds + 30.0
        )
        login = self._login
        if login.expired():
            await self._renew(login, why=EXPIRED)
            login = self._login
        session, _ = self._client()
        async with session.get(
            self._url(login, ref.path),
            params=params,
            headers=self._headers(login),
            proxy=login.proxy,
            timeout=timeout,
        ) as response:
            if response.status >= 300:
                answer = await response.read()
                if response.status == 401:
                    await self._renew(login)  # the caller's next attempt uses the new one
                raise KubeError(
                    f"watch {ref.path}: {_status_message(response.status, answer)}",
                    status=response.status,
                )
            # One event per line, of any length (a big object's line outgrows aiohttp's own
            # line reader): split here.
            pending = b""
            async for chunk in response.content.iter_any():
                lines = (pending + chunk).split(b"\n")
                pending = lines.pop()
                for line in lines:
                    if line.strip():
                        yield json.loads(line)
            if pending.strip():
                yield json.loads(pending)


def _status_message(status: int, answer: bytes) -> str:
    try:
        body = json.loads(answer)
    except ValueError:
        return answer[:300].decode(errors="replace") or f"HTTP {status}"
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    return f"HTTP {status}"
