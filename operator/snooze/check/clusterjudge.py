"""What the cluster's answers mean for Snooze: its CRDs against those this Snooze generates, its
operator's Deployment, which replica leads (kopf peering), and whether the operator's
ServiceAccount may do what api/rbac.py says it needs. Pure: objects in, results out."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from snooze.api import rbac
from snooze.api.models import LabelSelector
from snooze.api.times import parse_time
from snooze.check.report import CLUSTER, Kind, Result, Subject, failure, ok, warning

JSON = Mapping[str, Any]
APPLY_CRDS = "kubectl apply -f crds/ (the files of this Snooze's release)"
INSTALL = "install the chart (docs/install.md)"


# -- The API server --------------------------------------------------------------------------

OLDEST_KUBERNETES = (1, 28)
"""The CRDs' validation rules (CEL) need it; the chart's kubeVersion says the same."""


def api(server: str, version: JSON | None, failure_text: str) -> Result:
    """The `api` check: the API server answers, with a Kubernetes the CRDs' rules work on."""
    if version is None:
        return failure(
            CLUSTER,
            "api",
            f"no answer from the API server at {server}: {failure_text}",
            "check the kubeconfig's server and credentials (kubectl version says the same)",
        )
    shown = str(version.get("gitVersion") or "an unknown version")
    numbers = [re.match(r"\d+", str(version.get(k) or "")) for k in ("major", "minor")]
    if numbers[0] is None or numbers[1] is None:
        return warning(
            CLUSTER,
            "api",
            f"Kubernetes {shown} at {server}: its version cannot be read",
            "make sure it is 1.28 or newer (the CRDs' validation rules need it)",
        )
    found = (int(numbers[0].group()), int(numbers[1].group()))
    if found < OLDEST_KUBERNETES:
        return failure(
            CLUSTER,
            "api",
            f"Kubernetes {shown} at {server}: the CRDs' validation rules need 1.28 or newer",
            "upgrade the cluster to Kubernetes 1.28 or newer",
        )
    return ok(CLUSTER, "api", f"Kubernetes {shown} at {server}", version=shown)


# -- CRDs ------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class CrdSeen:
    """One CRD as read from the API: the object, or why it could not be read."""

    name: str
    expected: JSON
    installed: JSON | None = None
    missing: bool = False
    failure: str = ""


def crds(seen: Sequence[CrdSeen]) -> Result:
    """The `crds` check: each CRD installed, its version served and its schema, columns and
    names as this Snooze generates them."""
    failed: list[str] = []
    differ: list[str] = []
    unread: list[str] = []
    for crd in seen:
        if crd.missing:
            failed.append(f"{crd.name} is not installed")
            continue
        if crd.installed is None:
            unread.append(f"{crd.name} ({crd.failure})")
            continue
        problem = _crd_problem(crd.expected, crd.installed)
        if problem is not None:
            failed.append(f"{crd.name}: {problem}")
            continue
        difference = _crd_difference(crd.expected, crd.installed)
        if difference is not None:
            differ.append(f"{crd.name} differs at {difference}")
    names = ", ".join(crd.name for crd in seen)
    if failed:
        return failure(CLUSTER, "crds", "; ".join(failed + differ), APPLY_CRDS)
    if unread:
        return warning(
            CLUSTER,
            "crds",
            f"served, but not compared with this Snooze's: cannot read {'; '.join(unread)}",
            "run as someone who may get customresourcedefinitions to compare them",
        )
    if differ:
        return warning(
            CLUSTER,
            "crds",
            f"{'; '.join(differ)} from what this Snooze generates (another release's?)",
            APPLY_CRDS,
        )
    return ok(CLUSTER, "crds", f"{names} installed and served, as this Snooze generates them")


def _crd_problem(expected: JSON, installed: JSON) -> str | None:
    """What keeps the CRD from serving this Snooze's version, if anything."""
    want = expected["spec"]["versions"][0]["name"]
    versions = {v.get("name"): v for v in _list(installed.get("spec"), "versions")}
    version = versions.get(want)
    if version is None:
        return f"has no version {want} (it has {', '.join(map(str, versions)) or 'none'})"
    if not version.get("served"):
        return f"does not serve {want}"
    established = [
        c for c in _list(installed.get("status"), "conditions") if c.get("type") == "Established"
    ]
    if established and established[0].get("status") != "True":
        reason = established[0].get("message") or established[0].get("reason") or ""
        return f"is not established: {reason}"
    return None


def _crd_difference(expected: JSON, installed: JSON) -> str | None:
    """Where the installed CRD first differs from the expected one (its names, its version's
    schema, columns and subresources), as a JSON path; None when it does not."""
    want_version = expected["spec"]["versions"][0]
    have_version = next(
        v for v in _list(installed.get("spec"), "versions") if v.get("name") == want_version["name"]
    )
    pairs = [
        ("spec.names", expected["spec"]["names"], (installed.get("spec") or {}).get("names")),
        *(
            (
                f"spec.versions[{want_version['name']}].{key}",
                want_version.get(key),
                have_version.get(key),
            )
            for key in ("schema", "additionalPrinterColumns", "subresources")
        ),
    ]
    for path, want, have in pairs:
        found = first_difference(want, have, path)
        if found is not None:
            return found
    return None


def first_difference(want: Any, have: Any, path: str = "") -> str | None:
    """Pure: the JSON path where `have` first differs from `want` (keys in `want`'s order, then
    keys only `have` has); None when they are equal."""
    if isinstance(want, Mapping) and isinstance(have, Mapping):
        for key in [*want, *(k for k in have if k not in want)]:
            found = first_difference(want.get(key), have.get(key), f"{path}.{key}")
            if found is not None:
                return found
        return None
    if isinstance(want, list) and isinstance(have, list):
        if len(want) != len(have):
            return f"{path} ({len(have)} items, not {len(want)})"
        for i, (a, b) in enumerate(zip(want, have, strict=True)):
            found = first_difference(a, b, f"{path}[{i}]")
            if found is not None:
                return found
        return None
    return None if json.dumps(want) == json.dumps(have) else path


# -- The operator ----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class OperatorConfig:
    """What the operator's Deployment says of how it runs."""

    namespace: str
    name: str
    service_account: str
    peering: str | None
    """kopf's peering object's name (--peering); None: standalone."""
    watched: tuple[str, ...]
    """The namespaces it watches (--namespace); empty: all."""
    gateway_service: tuple[str, str] | None
    """Its --gateway-service, as (namespace, name)."""
    inference_gateway: bool
    """It reads the Inference Extension's InferencePools and pickers (--inference-gateway)."""
    replicas: int
    ready: int
    pod_selector: str
    """Its pods' label selector, as the API takes one."""

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.service_account}"

    def watches(self, namespace: str) -> bool:
        return not self.watched or namespace in self.watched


def operator_config(deployment: JSON) -> OperatorConfig:
    """Pure: how the operator of this Deployment runs, from its pod template's arguments."""
    meta = deployment.get("metadata") or {}
    spec = deployment.get("spec") or {}
    template = (spec.get("template") or {}).get("spec") or {}
    words: list[str] = []
    for container in template.get("containers") or []:
        if isinstance(container, Mapping):
            words += [str(w) for w in (container.get("command") or [])]
            words += [str(w) for w in (container.get("args") or [])]
    values: dict[str, list[str]] = {}
    for i, word in enumerate(words):
        flag, equals, inline = word.partition("=")
        if not flag.startswith("--"):
            continue
        value = inline if equals else (words[i + 1] if i + 1 < len(words) else "")
        values.setdefault(flag, []).append(value)
    gateway = (values.get("--gateway-service") or [""])[-1]
    gateway_ns, _, gateway_name = gateway.partition("/")
    replicas = spec.get("replicas")
    status = deployment.get("status") or {}
    return OperatorConfig(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        service_account=str(
            template.get("serviceAccountName") or template.get("serviceAccount") or "default"
        ),
        peering=(values.get("--peering") or [""])[-1] or None,
        watched=tuple(values.get("--namespace") or ()),
        gateway_service=(gateway_ns, gateway_name) if gateway_ns and gateway_name else None,
        inference_gateway="--inference-gateway" in values,
        replicas=replicas if isinstance(replicas, int) else 1,
        ready=int(status.get("readyReplicas") or 0),
        pod_selector=_selector(spec.get("selector")),
    )


def _selector(raw: object) -> str:
    try:
        return LabelSelector.model_validate(raw or {}).to_label_selector()
    except ValueError:
        return ""


def operator_subject(config: OperatorConfig) -> Subject:
    return Subject(kind=Kind.OPERATOR, namespace=config.namespace, name=config.name)


def operator(config: OperatorConfig) -> Result:
    """The `operator` check: its replicas ready, and peering where there is more than one."""
    subject = operator_subject(config)
    where = f"kubectl -n {config.namespace} describe deployment {config.name}"
    if config.replicas == 0:
        return failure(
            subject, "operator", "scaled to 0 replicas: nothing sleeps or wakes engines",
            f"kubectl -n {config.namespace} scale deployment {config.name} --replicas=1",
        )  # fmt: skip
    if config.replicas > 1 and config.peering is None:
        return failure(
            subject,
            "operator",
            f"{config.replicas} replicas without --peering: each would act on every model",
            "install it with the chart, which turns kopf peering on for more than one replica",
        )
    if config.ready == 0:
        return failure(subject, "operator", "no replica is ready", f"read {where} and its logs")
    watching = f"namespaces {', '.join(config.watched)}" if config.watched else "every namespace"
    said = f"{config.ready} of {config.replicas} replicas ready, watching {watching}"
    if config.ready < config.replicas:
        return warning(subject, "operator", said, f"read {where}")
    return ok(subject, "operator", said, replicas=config.replicas, ready=config.ready)


def not_found(searched: str) -> Result:
    return failure(
        CLUSTER,
        "operator",
        f"no Snooze operator found ({searched})",
        f"{INSTALL}; or name its Deployment with --operator NAMESPACE/NAME",
    )


@dataclass(frozen=True, kw_only=True)
class Peer:
    identity: str
    priority: int
    alive: bool


def peers(status: JSON | None, now: float) -> list[Peer]:
    """Pure: kopf's peers in a peering object's status, each alive while its last keep-alive
    plus its lifetime is ahead of `now` (seconds since the epoch; kopf's own rule)."""
    found = []
    for identity, info in (status or {}).items():
        if not isinstance(info, Mapping):
            continue
        priority = info.get("priority", 0)
        lifetime = info.get("lifetime", 60)
        seen = parse_time(str(info.get("lastseen") or ""))
        if not isinstance(priority, int) or not isinstance(lifetime, int) or seen is None:
            continue
        alive = seen + lifetime > now
        found.append(Peer(identity=str(identity), priority=priority, alive=alive))
    return found


def leader(
    config: OperatorConfig,
    *,
    peering: JSON | None,
    failure_text: str,
    pods: Sequence[str],
    now: float,
) -> Result:
    """The `leader` check: which replica acts. Standalone, the one ready pod; with kopf
    peering, the live peer of the highest priority, which must be one and one of the
    Deployment's pods (kopf pauses every replica that sees a live peer above it or level
    with it)."""
    subject = operator_subject(config)
    if config.peering is None:
        if len(pods) == 1:
            return ok(subject, "leader", f"standalone: pod {pods[0]} acts (no peering)")
        if not pods:
            return failure(
                subject, "leader", "standalone, and no operator pod is ready",
                f"kubectl -n {config.namespace} describe deployment {config.name}",
            )  # fmt: skip
        return failure(
            subject,
            "leader",
            f"standalone, with {len(pods)} ready pods ({', '.join(pods)}): each acts alone",
            "run one replica, or install with the chart, which turns peering on for more",
        )
    kind = "KopfPeering" if config.watched else "ClusterKopfPeering"
    if peering is None:
        return failure(
            subject,
            "leader",
            f"its {kind} {config.peering} cannot be read: {failure_text}",
            "kopf does not create it: the chart's peering.yaml does (and its CRDs, the chart's "
            "crds/); reinstall the chart",
        )
    found = peers(peering.get("status"), now)
    alive = sorted((p for p in found if p.alive), key=lambda p: -p.priority)
    if not alive:
        return failure(
            subject,
            "leader",
            f"no live peer in {kind} {config.peering}: no replica acts",
            f"read the operator's logs (kubectl -n {config.namespace} logs deploy/{config.name})",
        )
    top = [p for p in alive if p.priority == alive[0].priority]
    if len(top) > 1:
        names = ", ".join(p.identity for p in top)
        return failure(
            subject,
            "leader",
            f"{names} share the top priority {top[0].priority}: kopf pauses them all",
            "give each replica its own --priority (the operator draws one when none is given)",
        )
    head = top[0]
    standby = len(alive) - 1
    if head.identity not in pods:
        return warning(
            subject,
            "leader",
            f"the acting peer {head.identity} (priority {head.priority}) is not a pod of the "
            f"Deployment: its replicas stand by for it",
            "stop that operator (a developer's?), or let it act",
        )
    return ok(
        subject,
        "leader",
        f"pod {head.identity} acts (priority {head.priority}); {standby} standing by",
        leader=head.identity,
    )


# -- Permissions -----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Review:
    """One SelfSubjectAccessReview, made as the operator's ServiceAccount."""

    permission: rbac.Permission
    verb: str
    namespace: str
    """"": cluster-wide (every namespace, or a cluster-scoped resource)."""
    allowed: bool | None = None
    """None: the API gave no verdict."""
    reason: str = ""

    def attributes(self) -> dict[str, str]:
        resource, _, sub = self.permission.resource.partition("/")
        found = {"verb": self.verb, "group": self.permission.group, "resource": resource}
        if sub:
            found["subresource"] = sub
        if self.namespace:
            found["namespace"] = self.namespace
        return found

    @property
    def shown(self) -> str:
        where = f" in {self.namespace}" if self.namespace else ""
        group = f".{self.permission.group}" if self.permission.group else ""
        return f"{self.verb} {self.permission.resource}{group}{where}"


def reviews(config: OperatorConfig) -> list[Review]:
    """Pure: every (verb, resource, namespace) the operator needs (api/rbac.py), as it runs."""
    scopes = list(config.watched) or [""]
    found = [
        Review(permission=p, verb=verb, namespace=ns)
        for ns in scopes
        for p in rbac.OPERATOR
        for verb in p.verbs
    ]
    if config.peering is not None:
        peering = rbac.PEERING[1] if config.watched else rbac.PEERING[0]
        found += [
            Review(permission=peering, verb=verb, namespace=ns if config.watched else "")
            for ns in scopes
            for verb in peering.verbs
        ]
    if config.inference_gateway:
        found += [
            Review(permission=p, verb=verb, namespace=ns)
            for ns in scopes
            for p in rbac.INFERENCE_GATEWAY
            for verb in p.verbs
        ]
    if config.gateway_service is not None:
        found += [
            Review(permission=p, verb=verb, namespace=config.gateway_service[0])
            for p in rbac.GATEWAY_DISCOVERY
            for verb in p.verbs
        ]
    return found


def permissions(config: OperatorConfig, done: Sequence[Review], refused: str) -> Result:
    """The `permissions` check: every review allowed; `refused` says why none could be made
    (impersonation refused)."""
    subject = operator_subject(config)
    if refused:
        return warning(
            subject,
            "permissions",
            f"not checked: {refused}",
            f"run as someone who may impersonate {config.user} (a cluster admin), or ask one "
            f"to run: kubectl auth can-i --list --as={config.user}",
        )
    denied = [r for r in done if r.allowed is False]
    unknown = [r for r in done if r.allowed is None]
    if denied:
        shown = "; ".join(f"{r.shown} ({r.permission.why})" for r in denied[:4])
        more = f" and {len(denied) - 4} more" if len(denied) > 4 else ""
        return failure(
            subject,
            "permissions",
            f"{config.user} may not {shown}{more}",
            "install with the chart's RBAC (rbac.create: true), or grant what "
            "operator/snooze/api/rbac.py lists",
            denied=[r.shown for r in denied],
        )
    if unknown:
        return warning(
            subject,
            "permissions",
            f"the API gave no verdict on {len(unknown)} of {len(done)}: "
            f"{'; '.join(r.shown for r in unknown[:3])} ({unknown[0].reason or 'no reason'})",
            f"kubectl auth can-i --list --as={config.user}",
        )
    return ok(
        subject,
        "permissions",
        f"{config.user} may do all {len(done)} things the operator needs",
        reviews=len(done),
    )


def _list(parent: Any, key: str) -> list[Mapping[str, Any]]:
    value = parent.get(key) if isinstance(parent, Mapping) else None
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []
