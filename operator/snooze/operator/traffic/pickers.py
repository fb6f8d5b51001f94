"""The endpoint pickers' queues: for each model, the Inference Extension's InferencePools that
select its pods, and the requests their pickers hold for it (operator/traffic/pickerpage.py), so
that a request queued there wakes the model as one held at Snooze's gateway does
(pickerwake.py).

Every `refresh` seconds (the probe interval) the pools of the namespaces with models are listed
and each picker's Service is resolved to its ready endpoints on its metrics port; every
`interval` seconds each of those is scraped. Nothing is listed while no model is followed, and
while the API does not serve InferencePools (their CRD is not installed) only its discovery is
asked, once per `refresh`. A picker that cannot be read is one of the model's problems, said on
its status; nothing here raises into a model's loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

import aiohttp

from snooze.api.conditions import ConditionReason
from snooze.api.reasons import FailureReason
from snooze.engine.http import TooLarge, read_bounded
from snooze.kube.api import KubeApi, KubeError, NotFound
from snooze.kube.inferencepools import (
    GROUP,
    PLURAL,
    VERSION,
    InferencePool,
    endpointslices_ref,
    pools_ref,
    read_pool,
    ready_addresses,
    services_ref,
)
from snooze.operator.traffic.pickerpage import PAGE_LIMIT, QueuePage
from snooze.policy.pickers import pools_serving

log = logging.getLogger(__name__)
Key = tuple[str, str]
"""A model's (namespace, name)."""
TargetKey = tuple[str, str, str]
"""A picker's metrics port: (namespace, Service, port name)."""

# Bounds on what a tenant's objects can make the operator do every interval.
POOLS_LIMIT = 8
"""Pools read for one model; more are named as a problem."""
REPLICAS_LIMIT = 16
"""Picker replicas (ready addresses) scraped behind one Service."""
SCRAPES_AT_ONCE = 32
TOKEN_LIMIT = 16 * 1024
TOKEN_FIX = (
    "give the operator a token whose ServiceAccount may get the non-resource URL /metrics "
    "(the chart's inferenceGateway.enabled makes one), or run the picker with "
    "--metrics-endpoint-auth=false"
)


@dataclass(frozen=True)
class Problem:
    """Why (part of) a picker could not be read, and what to do."""

    reason: str
    message: str


@dataclass(frozen=True, kw_only=True)
class PickerReading:
    """What a model's pickers say now."""

    pools: tuple[str, ...]
    """The InferencePools that select its pods."""
    queued: int | None
    """Requests their pickers hold for it; None when no picker could be read."""
    problems: tuple[Problem, ...] = ()


@dataclass(frozen=True)
class Follower:
    """A model whose pickers are read."""

    labels: tuple[Mapping[str, str], ...]
    """Its pods' labels, and those its workload's pods will have."""
    model_name: str
    poke: Callable[[], None]


@dataclass(frozen=True)
class Target:
    """One picker Service's metrics port, resolved: its replicas' URLs, or why there are none."""

    urls: tuple[str, ...] = ()
    problem: Problem | None = None


@dataclass(frozen=True)
class Scraped:
    """One picker Service's replicas, scraped once."""

    queued: Mapping[str, int]
    answered: int
    problems: tuple[Problem, ...]


class PickerQueues:
    """Reads the pickers of the models that follow them (`follow`, at each of their cycles)."""

    def __init__(
        self,
        *,
        api: KubeApi,
        interval: float,
        refresh: float,
        timeout: float,
        pod_addresses: Callable[[str], Collection[str]],
        token_file: str | None = None,
    ) -> None:
        self.api = api
        self.pod_addresses = pod_addresses
        """The addresses of a namespace's pods: a picker is read at those alone. An
        EndpointSlice may be written by hand, with any address in it, and the token must not
        go, nor the operator's requests, wherever a tenant points them."""
        self.interval = interval
        self.refresh = refresh
        self.timeout = timeout
        self.token_file = token_file
        self._followers: dict[Key, Follower] = {}
        self._pools: dict[str, list[InferencePool]] = {}
        self._targets: dict[TargetKey, Target] = {}
        self._scraped: dict[TargetKey, Scraped] = {}
        self._readers: dict[TargetKey, set[Key]] = {}
        """The models each picker is read for."""
        self._inflight: dict[TargetKey, asyncio.Task[None]] = {}
        """The scrape under way of each picker: never two of one, and a slow one (a page that
        never ends) holds up no other."""
        self._readings: dict[Key, PickerReading] = {}
        self._served: bool | None = None
        self._refreshed = -math.inf
        self._told: dict[str, str] = {}
        self._slots = asyncio.Semaphore(SCRAPES_AT_ONCE)

    # -- What the models' loops call -----------------------------------------------------------

    def follow(
        self,
        key: Key,
        *,
        labels: Iterable[Mapping[str, str]],
        model_name: str,
        poke: Callable[[], None],
    ) -> None:
        self._followers[key] = Follower(tuple(labels), model_name, poke)

    def forget(self, key: Key) -> None:
        self._followers.pop(key, None)
        self._readings.pop(key, None)

    def reading(self, key: Key) -> PickerReading | None:
        """What the model's pickers said at the last scrape; None: no pool selects its pods."""
        return self._readings.get(key)

    def queued(self, namespace: str, model: str) -> int | None:
        reading = self._readings.get((namespace, model))
        return None if reading is None else reading.queued

    # -- The loop ---------------------------------------------------------------------------------

    async def run(self) -> None:
        """Read until cancelled."""
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            try:
                while True:
                    began = time.monotonic()
                    try:
                        await self.read(session)
                    except asyncio.CancelledError:
                        raise
                    except Exception:
                        log.exception("reading the endpoint pickers failed; trying again")
                    await asyncio.sleep(max(0.0, began + self.interval - time.monotonic()))
            finally:
                for task in self._inflight.values():
                    task.cancel()
                await asyncio.gather(*self._inflight.values(), return_exceptions=True)

    async def read(self, session: aiohttp.ClientSession) -> None:
        """One round: the pools and their pickers' endpoints when due; a scrape of each picker
        not still being scraped (each says what it read as soon as it has: see `_scrape_into`);
        then what every model's pickers said last."""
        now = time.monotonic()
        if self._followers and now - self._refreshed >= self.refresh:
            # Not before a model follows: the first one is served at once, not a refresh later.
            self._refreshed = now
            await self._refresh_pools()
        token, token_problem = self._token()
        for key, target in self._targets.items():
            if target.problem is None and key not in self._inflight:
                task = asyncio.create_task(
                    self._scrape_into(session, key, target, token, token_problem),
                    name=f"picker {key[0]}/{key[1]}",
                )
                self._inflight[key] = task
                task.add_done_callback(functools.partial(self._scraped_one, key))
        self._scraped = {k: v for k, v in self._scraped.items() if k in self._targets}
        self._publish(self._followers)

    def _scraped_one(self, key: TargetKey, task: asyncio.Task[None]) -> None:
        self._inflight.pop(key, None)
        if not task.cancelled() and task.exception() is not None:
            log.error("reading picker %s/%s failed", key[0], key[1], exc_info=task.exception())

    async def _scrape_into(
        self,
        session: aiohttp.ClientSession,
        key: TargetKey,
        target: Target,
        token: str | None,
        token_problem: Problem | None,
    ) -> None:
        scraped = await self._scrape(session, target, token, token_problem)
        if self._targets.get(key) == target:
            self._scraped[key] = scraped
            self._publish(self._readers.get(key, ()))

    # -- The pools and their pickers' endpoints --------------------------------------------------

    async def _refresh_pools(self) -> None:
        namespaces = sorted({namespace for namespace, _ in self._followers})
        if not namespaces or not await self._pools_served():
            self._pools, self._targets = {}, {}
            return
        pools: dict[str, list[InferencePool]] = {}
        for namespace in namespaces:
            try:
                listing = await self.api.list(pools_ref(namespace))
            except NotFound:
                continue  # its CRD went: discovery says so at the next refresh
            except KubeError as exc:
                self._tell(
                    f"list {namespace}",
                    f"cannot list the InferencePools of namespace {namespace}: {exc}; the "
                    "operator needs list on inferencepools.inference.networking.k8s.io there "
                    "(the chart's inferenceGateway.enabled grants it)",
                )
                continue
            self._untell(f"list {namespace}")
            pools[namespace] = [read_pool(item) for item in listing.get("items") or []]
        self._pools = pools
        wanted = self._wanted_targets()
        resolved = await asyncio.gather(*(self._resolve(*key) for key in wanted))
        self._targets = dict(zip(wanted, resolved, strict=True))

    def _wanted_targets(self) -> list[TargetKey]:
        """The pickers of the pools that serve a followed model (and for which models)."""
        readers: dict[TargetKey, set[Key]] = {}
        for key, follower in self._followers.items():
            serving = pools_serving(self._pools.get(key[0], []), follower.labels)
            for pool in sorted(serving, key=lambda p: p.name)[:POOLS_LIMIT]:
                if not pool.problem:
                    readers.setdefault((key[0], pool.picker, pool.port_name), set()).add(key)
        self._readers = readers
        return list(readers)

    async def _pools_served(self) -> bool:
        with contextlib.suppress(KubeError):  # the API may be away: as it was, until it answers
            self._served = await self.api.serves(GROUP, VERSION, PLURAL)
        if self._served:
            self._untell("crd")
        else:
            self._tell(
                "crd",
                f"InferencePools ({PLURAL}.{GROUP}/{VERSION}) are not served: no endpoint "
                f"picker is read until their CRD is installed; checking every {self.refresh:g}s",
                level=logging.INFO,
            )
        return bool(self._served)

    async def _resolve(self, namespace: str, service: str, port_name: str) -> Target:
        where = f"Service {service} of namespace {namespace}"
        try:
            body = await self.api.get(services_ref(namespace), service)
            slices = await self.api.list(
                endpointslices_ref(namespace),
                label_selector=f"kubernetes.io/service-name={service}",
            )
        except NotFound:
            return Target(problem=Problem(ConditionReason.PICKER_NOT_FOUND, f"there is no {where}"))
        except KubeError as exc:
            return Target(
                problem=Problem(
                    ConditionReason.API_ERROR,
                    f"cannot read {where} and its EndpointSlices: {exc}; the operator needs get "
                    "on services and list on endpointslices there (the chart's "
                    "inferenceGateway.enabled grants them)",
                )
            )
        if (body.get("spec") or {}).get("type") == "ExternalName":
            return Target(
                problem=Problem(
                    ConditionReason.NOT_A_SERVICE,
                    f"{where} is an ExternalName: a picker's Service has endpoints",
                )
            )
        listed, has_port = ready_addresses(slices.get("items") or [], port_name)
        pods = set(self.pod_addresses(namespace))
        addresses = [a for a in listed if a.rpartition(":")[0].strip("[]") in pods]
        if not has_port:
            return Target(
                problem=Problem(
                    ConditionReason.NO_METRICS_PORT,
                    f"{where} has no port named {port_name!r}: name the picker's metrics port "
                    "so, or give its name in the pool's annotation snooze.dev/picker-metrics-port",
                )
            )
        if listed and not addresses:
            return Target(
                problem=Problem(
                    ConditionReason.NOT_A_POD,
                    f"{where}'s endpoints are no addresses of pods of its namespace: Snooze "
                    "reads a picker at its pods only",
                )
            )
        if not addresses:
            return Target(
                problem=Problem(
                    ConditionReason.NO_ENDPOINTS,
                    f"{where} has no ready endpoint: is its picker up?",
                )
            )
        urls = tuple(f"http://{address}/metrics" for address in sorted(set(addresses)))
        if len(urls) > REPLICAS_LIMIT:
            urls = urls[:REPLICAS_LIMIT]
            self._tell(
                f"replicas {namespace}/{service}",
                f"{where} has {len(addresses)} ready endpoints: {REPLICAS_LIMIT} are read",
            )
        return Target(urls=urls)

    # -- The pickers' pages --------------------------------------------------------------------

    def _token(self) -> tuple[str | None, Problem | None]:
        if self.token_file is None:
            return None, None
        try:
            with open(self.token_file, "rb") as source:
                raw = source.read(TOKEN_LIMIT + 1)
        except OSError as exc:
            return None, Problem(
                ConditionReason.TOKEN_UNREADABLE,
                f"cannot read the token file {self.token_file} ({exc.strerror}): {TOKEN_FIX}",
            )
        token = raw.strip()
        if not token or len(raw) > TOKEN_LIMIT or not all(33 <= b < 127 for b in token):
            return None, Problem(
                ConditionReason.TOKEN_UNREADABLE,
                f"the token file {self.token_file} holds no token: {TOKEN_FIX}",
            )
        return token.decode(), None

    async def _scrape(
        self,
        session: aiohttp.ClientSession,
        target: Target,
        token: str | None,
        token_problem: Problem | None,
    ) -> Scraped:
        pages = await asyncio.gather(*(self._page(session, url, token) for url in target.urls))
        queued: dict[str, int] = {}
        problems: dict[str, Problem] = {}
        if token_problem is not None:
            problems[token_problem.reason] = token_problem
        answered = 0
        for found, problem in pages:
            if problem is not None:
                problems.setdefault(problem.reason, problem)
            if found is not None:
                answered += 1
                for model, count in found.items():
                    queued[model] = queued.get(model, 0) + count
        return Scraped(queued, answered, tuple(problems.values()))

    async def _page(
        self, session: aiohttp.ClientSession, url: str, token: str | None
    ) -> tuple[dict[str, int] | None, Problem | None]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        page = QueuePage()
        try:
            async with (
                self._slots,
                asyncio.timeout(self.timeout),
                session.get(url, headers=headers, allow_redirects=False) as response,
            ):
                if response.status != 200:
                    return None, _refused(url, response.status, sent_token=token is not None)
                await read_bounded(response, limit=PAGE_LIMIT, sink=page.feed)
            return page.result(), None
        except TooLarge as exc:
            return None, Problem(
                FailureReason.ANSWER_TOO_LARGE, f"{url} answered {exc}, more than is read"
            )
        except TimeoutError:
            return None, Problem(FailureReason.TIMEOUT, f"{url} took longer than {self.timeout:g}s")
        except aiohttp.ClientError as exc:
            return None, Problem(FailureReason.UNREACHABLE, f"{url}: {exc or type(exc).__name__}")
        except ValueError as exc:
            return None, Problem(
                FailureReason.INVALID_ANSWER, f"{url}'s page cannot be read or believed: {exc}"
            )

    # -- What the models read ------------------------------------------------------------------

    def _publish(self, keys: Iterable[Key]) -> None:
        """Say to these models what their pickers said last; poke those it changed, and those
        for which requests wait."""
        for key in list(keys):
            follower = self._followers.get(key)
            if follower is None:
                continue
            reading = self._reading_of(key[0], follower)
            before = self._readings.get(key)
            if reading is None:
                self._readings.pop(key, None)
            else:
                self._readings[key] = reading
            if reading != before or (reading is not None and reading.queued):
                follower.poke()

    def _reading_of(self, namespace: str, follower: Follower) -> PickerReading | None:
        serving = sorted(
            pools_serving(self._pools.get(namespace, []), follower.labels), key=lambda p: p.name
        )
        if not serving:
            return None
        problems: list[Problem] = []
        if len(serving) > POOLS_LIMIT:
            problems.append(
                Problem(
                    ConditionReason.TOO_MANY_POOLS,
                    f"{len(serving)} InferencePools select its pods: the first {POOLS_LIMIT} by "
                    "name are read",
                )
            )
            serving = serving[:POOLS_LIMIT]
        queued: int | None = None
        seen: set[TargetKey] = set()
        for pool in serving:
            if pool.problem:
                problems.append(
                    Problem(
                        ConditionReason.INVALID_POOL, f"InferencePool {pool.name}: {pool.problem}"
                    )
                )
                continue
            key = (namespace, pool.picker, pool.port_name)
            target, scraped = self._targets.get(key), self._scraped.get(key)
            if key in seen or target is None:
                continue  # one picker counted once; one not resolved yet is, at the next refresh
            seen.add(key)
            said = [target.problem] if target.problem else list(scraped.problems if scraped else ())
            for problem in said:
                problems.append(
                    Problem(
                        problem.reason, f"InferencePool {pool.name}'s picker: {problem.message}"
                    )
                )
            if scraped is not None and scraped.answered:
                queued = (queued or 0) + scraped.queued.get(follower.model_name, 0)
        return PickerReading(
            pools=tuple(p.name for p in serving), queued=queued, problems=tuple(problems)
        )

    def _tell(self, key: str, message: str, *, level: int = logging.WARNING) -> None:
        """Log `message` once, until it changes or `_untell` clears it."""
        if self._told.get(key) != message:
            self._told[key] = message
            log.log(level, "%s", message)

    def _untell(self, key: str) -> None:
        if self._told.pop(key, None) is not None:
            log.info("%s: resolved", key)


def _refused(url: str, status: int, *, sent_token: bool) -> Problem:
    if status == 401:
        said = "refused the token it was given" if sent_token else "asks for a token"
        return Problem(ConditionReason.UNAUTHORIZED, f"{url} {said} (401): {TOKEN_FIX}")
    if status == 403:
        return Problem(
            ConditionReason.FORBIDDEN,
            f"{url} denied get on /metrics to the token's ServiceAccount (403): bind it to a "
            "ClusterRole with nonResourceURLs [/metrics] and verb get (the chart's "
            "inferenceGateway.enabled does)",
        )
    return Problem(FailureReason.HTTP_ERROR, f"{url} answered {status}, not its metrics page")
