"""`snooze check` on a cluster: read what the checks need through the API, each read bounded in
time and its failure kept for its line, then judge (check/clusterjudge.py, check/modeljudge.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from snooze.api import crd, gpupool, models
from snooze.check import clusterjudge, modeljudge
from snooze.check.clusterjudge import CrdSeen, OperatorConfig, Review
from snooze.check.report import CLUSTER, Level, Result, failure, warning
from snooze.kube.api import KubeApi, KubeError, NotFound, Ref, models_ref, pods_ref
from snooze.kube.credentials import Source
from snooze.kube.pods import pod_info

T = TypeVar("T")
JSON = dict[str, Any]
READ_SECONDS = 30.0
"""The most one read (with the API client's retries) may take: a list of every pod of a large
cluster included."""
OPERATOR_LABELS = "app.kubernetes.io/part-of=snooze,app.kubernetes.io/component=operator"
"""The chart's labels on the operator's Deployment."""
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
REVIEWS = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"


class Unread(Exception):
    """A read that failed or took too long; the message says which and why."""


async def _read(what: str, call: Awaitable[T]) -> T:
    try:
        async with asyncio.timeout(READ_SECONDS):
            return await call
    except TimeoutError:
        raise Unread(f"reading {what} took longer than {READ_SECONDS:g}s") from None
    except NotFound:
        raise
    except KubeError as exc:
        raise Unread(f"reading {what}: {exc}") from None


async def check_cluster(
    source: Source, *, namespaces: Sequence[str], operator: str | None
) -> list[Result]:
    """Every check of the cluster, in the order a person reads them."""
    api = KubeApi(source, timeout=10.0)
    try:
        return await _checks(api, namespaces, operator)
    finally:
        await api.aclose()


async def _checks(api: KubeApi, namespaces: Sequence[str], named: str | None) -> list[Result]:
    reached = await _api(api)
    if reached.level is Level.FAILURE:
        return [reached]  # every other read would fail the same way, each after retries
    configs, operators = await _operators(api, named)
    watched: Sequence[str] | None = None
    if configs:
        every = any(not c.watched for c in configs)
        watched = () if every else sorted({ns for c in configs for ns in c.watched})
    summary, objects = await _models_and_pools(api, namespaces, watched, bool(configs))
    results = [reached, await _crds(api), *operators, *summary]
    for config in configs:
        results += await _operator(api, config)
    return results + objects


async def _api(api: KubeApi) -> Result:
    """One read, not retried: whether the API server answers at all, and its version."""
    try:
        async with asyncio.timeout(READ_SECONDS):
            version = await api.request("GET", "/version", retry=False)
    except TimeoutError:
        return clusterjudge.api(api.server, None, f"no answer within {READ_SECONDS:g}s")
    except KubeError as exc:
        return clusterjudge.api(api.server, None, str(exc))
    return clusterjudge.api(api.server, version, "")


async def _crds(api: KubeApi) -> Result:
    seen = []
    for make in crd.CRDS.values():
        expected = make()
        name = expected["metadata"]["name"]
        try:
            installed = await _read(f"CRD {name}", api.request("GET", f"{CRDS}/{name}"))
        except NotFound:
            seen.append(CrdSeen(name=name, expected=expected, missing=True))
            continue
        except Unread as exc:
            served = await _served(api, expected)
            seen.append(CrdSeen(name=name, expected=expected, missing=not served, failure=str(exc)))
            continue
        seen.append(CrdSeen(name=name, expected=expected, installed=installed))
    return clusterjudge.crds(seen)


async def _served(api: KubeApi, expected: JSON) -> bool:
    """Whether discovery lists the CRD's resource (readable by everyone)."""
    plural = expected["spec"]["names"]["plural"]
    try:
        return await _read("discovery", api.serves(models.GROUP, models.VERSION, plural))
    except (Unread, NotFound):
        return False


async def _operators(api: KubeApi, named: str | None) -> tuple[list[OperatorConfig], list[Result]]:
    """The operators' Deployments: the one --operator names, else those with the chart's labels."""
    if named is not None:
        namespace, _, name = named.partition("/")
        ref = Ref(f"/apis/apps/v1/namespaces/{namespace}/deployments")
        try:
            body = await _read(f"Deployment {named}", api.get(ref, name))
        except NotFound:
            return [], [clusterjudge.not_found(f"no Deployment {named}")]
        except Unread as exc:
            return [], [_unread("operator", exc)]
        return [clusterjudge.operator_config(body)], []
    try:
        listed = await _read(
            "Deployments",
            api.list(Ref("/apis/apps/v1/deployments"), label_selector=OPERATOR_LABELS),
        )
    except (Unread, NotFound) as exc:
        return [], [_unread("operator", exc, "or name it with --operator NAMESPACE/NAME")]
    items = [i for i in listed.get("items") or [] if isinstance(i, dict)]
    if not items:
        return [], [clusterjudge.not_found(f"no Deployment labelled {OPERATOR_LABELS}")]
    return [clusterjudge.operator_config(item) for item in items], []


async def _operator(api: KubeApi, config: OperatorConfig) -> list[Result]:
    """The `operator`, `leader` and `permissions` checks of one operator."""
    results = [clusterjudge.operator(config)]
    subject = clusterjudge.operator_subject(config)
    try:
        pods = await _operator_pods(api, config)
    except (Unread, NotFound) as exc:
        results.append(_unread("leader", exc, subject=subject))
        pods = None
    if pods:  # none ready: the operator line says so
        peering, why = await _peering(api, config)
        results.append(
            clusterjudge.leader(
                config, peering=peering, failure_text=why, pods=pods, now=time.time()
            )
        )
    results.append(await _permissions(api, config))
    return results


async def _operator_pods(api: KubeApi, config: OperatorConfig) -> list[str]:
    """The names of the Deployment's ready pods."""
    listed = await _read(
        "the operator's pods",
        api.list(pods_ref(config.namespace), label_selector=config.pod_selector),
    )
    return sorted(info.name for info in map(pod_info, _items(listed)) if info.ready)


async def _peering(api: KubeApi, config: OperatorConfig) -> tuple[JSON | None, str]:
    if config.peering is None:
        return None, ""
    if config.watched:
        # A namespaced operator has a KopfPeering in each namespace it watches; they agree.
        path = f"/apis/kopf.dev/v1/namespaces/{config.watched[0]}/kopfpeerings/{config.peering}"
    else:
        path = f"/apis/kopf.dev/v1/clusterkopfpeerings/{config.peering}"
    try:
        return await _read(f"peering {config.peering}", api.request("GET", path)), ""
    except NotFound as exc:
        return None, f"not found ({exc})"
    except Unread as exc:
        return None, str(exc)


async def _permissions(api: KubeApi, config: OperatorConfig) -> Result:
    """One SelfSubjectAccessReview per (verb, resource, namespace), made as the operator's
    ServiceAccount by impersonation."""
    wanted = clusterjudge.reviews(config)
    headers = {"Impersonate-User": config.user}

    async def review(item: Review) -> Review:
        body = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": item.attributes()},
        }
        answer = await _read(
            "a SelfSubjectAccessReview",
            api.request("POST", REVIEWS, body=body, headers=headers, retry=False),
        )
        status = answer.get("status") or {}
        allowed = status.get("allowed")
        return replace(
            item,
            allowed=allowed if isinstance(allowed, bool) else None,
            reason=str(status.get("reason") or status.get("evaluationError") or ""),
        )

    try:
        first = await review(wanted[0])
    except (Unread, NotFound) as exc:
        return clusterjudge.permissions(config, [], refused=str(exc))
    try:
        rest = await asyncio.gather(*(review(item) for item in wanted[1:]))
    except (Unread, NotFound) as exc:
        return clusterjudge.permissions(config, [], refused=str(exc))
    return clusterjudge.permissions(config, [first, *rest], refused="")


async def _models_and_pools(
    api: KubeApi, namespaces: Sequence[str], watched: Sequence[str] | None, operator: bool
) -> tuple[list[Result], list[Result]]:
    """The cluster's line on its models when there is one to say (none found, none readable),
    and each model's and pool's lines."""
    scopes: list[str | None] = list(namespaces) or [None]
    try:
        found = await asyncio.gather(*(_listed(api, ns) for ns in scopes))
    except NotFound:
        return [
            failure(
                CLUSTER,
                "models",
                "InferenceModels and GPUPools are not served, so none can be listed",
                "see the crds line",
            )
        ], []
    except Unread as exc:
        return [_unread("models", exc)], []
    models_found = [m for each in found for m in each[0]]
    pools = [p for each in found for p in each[1]]
    pods = [p for each in found for p in each[2]]
    if not models_found and not pools:
        where = f"namespaces {', '.join(namespaces)}" if namespaces else "the cluster"
        return [
            warning(
                CLUSTER,
                "models",
                f"no InferenceModel in {where}: Snooze has nothing to do yet",
                "declare one per model (examples/vllm-qwen3-8b.yaml)",
            )
        ], []
    results: list[Result] = []
    for body in models_found:
        results += modeljudge.model(
            body, modeljudge.selected(body, pods), watched=watched, operator=operator
        )
    for body in pools:
        results += modeljudge.pool(body, modeljudge.members(body, pools, models_found, pods))
    return [], results


async def _listed(api: KubeApi, namespace: str | None) -> tuple[list[JSON], list[JSON], list[JSON]]:
    """The InferenceModels, GPUPools and pods of a namespace (None: of every namespace); no
    GPUPools where their CRD is missing (the crds line says so), NotFound where the
    InferenceModels' is."""
    where = f" in {namespace}" if namespace else ""
    pool_path = f"/apis/{models.GROUP}/{models.VERSION}"
    pool_path += f"/namespaces/{namespace}/{gpupool.PLURAL}" if namespace else f"/{gpupool.PLURAL}"

    async def pools() -> JSON:
        try:
            return await _read(f"GPUPools{where}", api.list(Ref(pool_path)))
        except NotFound:
            return {}

    listed_models, listed_pools, listed_pods = await asyncio.gather(
        _read(f"InferenceModels{where}", api.list(models_ref(namespace))),
        pools(),
        _read(f"pods{where}", api.list(pods_ref(namespace))),
    )
    return _items(listed_models), _items(listed_pools), _items(listed_pods)


def _items(listed: JSON) -> list[JSON]:
    items = [i for i in listed.get("items") or [] if isinstance(i, dict)]
    return sorted(
        items,
        key=lambda i: (
            (i.get("metadata") or {}).get("namespace", ""),
            (i.get("metadata") or {}).get("name", ""),
        ),
    )


def _unread(check: str, error: Exception, also: str = "", subject: Any = CLUSTER) -> Result:
    fix = "check that the API answers and that you may read it"
    return failure(subject, check, f"cannot tell: {error}", f"{fix}{'; ' + also if also else ''}")
