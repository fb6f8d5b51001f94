"""What the cluster says of each InferenceModel (its pods, and its engines as the operator last
saw them on its status) and of each GPUPool (its members on one node and one claim). Pure:
objects in, results out.

The engines are judged from the status the operator writes, not probed from here: the operator
reaches them from inside the cluster, through the NetworkPolicy that admits it, and that is
the reach that matters; a laptop cannot reach pod addresses, and a probe through the API
server's pod proxy would be refused by the same policy exactly when the install is right.
`snooze check --engine` probes one engine directly, from where its port can be reached.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from snooze.api.conditions import ConditionType
from snooze.api.gpupool import parse_pool_status
from snooze.api.models import InferenceModelSpec, SpecError, parse_spec
from snooze.api.modelstatus import Condition, parse_status
from snooze.api.reasons import FailureReason
from snooze.check.report import Kind, Result, Subject, failure, ok, warning
from snooze.kube.pods import PodInfo, pod_info, pool_name_of

JSON = Mapping[str, Any]
SHOWN = 4
"""Pods named in a line; the rest counted."""
# Conditions a model's status carries that mean something needs doing, and how much.
FAILING = {ConditionType.SPEC_VALID: "False", ConditionType.CONFLICT: "True"}
WARNING = {
    ConditionType.KNOWN_BUG: "True",
    ConditionType.WAKE_FAILED: "True",
    ConditionType.SLEEP_FAILED: "True",
    ConditionType.SHARED_PODS: "True",
    ConditionType.WAITING_FOR_ROOM: "True",
    # Behind the Inference Gateway: a queue that cannot be read wakes nothing.
    ConditionType.PICKER_READABLE: "False",
}
POOL_FAILING = {
    ConditionType.SPEC_VALID: "False",
    ConditionType.OVERCOMMITTED: "True",
    ConditionType.CLAIM_CONFLICT: "True",
}
POOL_WARNING = {ConditionType.MEMORY_NOT_FREED: "True"}


def model_subject(model: JSON) -> Subject:
    meta = model.get("metadata") or {}
    return Subject(
        kind=Kind.MODEL, namespace=str(meta.get("namespace") or ""), name=str(meta.get("name"))
    )


def spec_of(model: JSON) -> InferenceModelSpec | None:
    try:
        return parse_spec(dict(model.get("spec") or {}))
    except SpecError:
        return None


def selected(model: JSON, pods: Sequence[JSON]) -> list[JSON]:
    """The pods of the model's namespace that its selector selects."""
    spec = spec_of(model)
    namespace = (model.get("metadata") or {}).get("namespace")
    if spec is None:
        return []
    return [
        pod
        for pod in pods
        if (pod.get("metadata") or {}).get("namespace") == namespace
        and spec.selector.matches((pod.get("metadata") or {}).get("labels") or {})
    ]


def model(
    body: JSON, pods: Sequence[JSON], *, watched: Sequence[str] | None, operator: bool
) -> list[Result]:
    """The `model`, `pods` and `engines` checks of one InferenceModel; `pods` are those its
    selector selects, `watched` the namespaces its operator watches (empty: all; None: no
    operator found), `operator` whether one was found at all."""
    subject = model_subject(body)
    found = [
        _reported(subject, body, watched=watched, operator=operator),
        _pods(subject, body, pods),
    ]
    if body.get("status"):
        found.append(_engines(subject, body, pods))
    return found


def _reported(
    subject: Subject, body: JSON, *, watched: Sequence[str] | None, operator: bool
) -> Result:
    meta = body.get("metadata") or {}
    if watched and subject.namespace not in watched:
        return failure(
            subject,
            "model",
            f"the operator watches only {', '.join(watched)}: nothing acts on this model",
            "install Snooze with this namespace in watchNamespaces, or move the model",
        )
    raw = body.get("status")
    status = parse_status(raw)
    spec_error = _spec_error(body)
    if spec_error:
        return failure(subject, "model", f"its spec is invalid: {spec_error}", "fix the spec")
    if not raw:
        why = "" if operator else " (no operator was found)"
        return failure(
            subject,
            "model",
            f"the operator has not reported on it{why}",
            "check the operator's lines above and its logs",
        )
    generation = meta.get("generation")
    stale = (
        isinstance(generation, int)
        and status.observed_generation is not None
        and status.observed_generation < generation
    )
    conditions = {c.type: c for c in status.conditions}
    bad = _conditions(conditions, FAILING)
    if bad:
        return failure(subject, "model", f"phase {status.phase.value}; {bad}", _MODEL_FIX)
    said = f"phase {status.phase.value}, model name {status.model_name or '(none)'}"
    doubtful = _conditions(conditions, WARNING)
    if stale:
        doubtful = "; ".join(
            p
            for p in (f"the operator has not reported on generation {generation} yet", doubtful)
            if p
        )
    if doubtful:
        return warning(subject, "model", f"{said}; {doubtful}", _MODEL_FIX)
    return ok(subject, "model", said, phase=status.phase.value)


_MODEL_FIX = "kubectl describe im: its conditions and Events say what to do"
_ENGINES_FIX = "kubectl describe im and its pods: the status says why each is in its state"


def _spec_error(body: JSON) -> str:
    try:
        parse_spec(dict(body.get("spec") or {}))
    except SpecError as exc:
        return " ".join(str(exc).split())
    return ""


def _conditions(found: Mapping[str, Condition], wanted: Mapping[ConditionType, str]) -> str:
    return "; ".join(
        f"{kind}: {found[kind].message or found[kind].reason}"
        for kind, status in wanted.items()
        if kind in found and found[kind].status == status
    )


def _pods(subject: Subject, body: JSON, pods: Sequence[JSON]) -> Result:
    spec = spec_of(body)
    selector = spec.selector.to_label_selector() if spec is not None else "(invalid)"
    if not pods:
        return warning(
            subject,
            "pods",
            f"no pod in {subject.namespace} matches its selector {selector}",
            "label the engines' pods to match spec.selector, or start them",
        )
    infos = [pod_info(pod) for pod in pods]
    ready = [p for p in infos if p.ready]
    said = f"{len(pods)} match its selector, {len(ready)} ready"
    reported = parse_status(body.get("status")).engines
    if body.get("status") and reported != len(pods):
        return warning(
            subject,
            "pods",
            f"{said}; the operator counts {reported} (it may be catching up)",
            "run it again in a minute; if it stays, read the operator's logs",
        )
    return ok(subject, "pods", said, pods=len(pods), ready=len(ready))


def _engines(subject: Subject, body: JSON, pods: Sequence[JSON]) -> Result:
    """Its engines as the operator last saw them (status.pods)."""
    status = parse_status(body.get("status"))
    by_state: dict[str, list[str]] = {}
    no_sleep: list[str] = []
    for entry in status.pods:
        by_state.setdefault(entry.state, []).append(entry.name)
        if entry.sleep_failure_reason == FailureReason.SLEEP_MODE_DISABLED:
            no_sleep.append(entry.name)
    seen = {entry.name for entry in status.pods}
    unseen = [i.name for i in map(pod_info, pods) if i.ready and i.name not in seen]
    counts = ", ".join(f"{len(names)} {state}" for state, names in sorted(by_state.items()))
    said = f"as the operator last saw them: {counts or 'none'}"
    if "unreachable" in by_state:
        return failure(
            subject,
            "engines",
            f"{said}; it cannot reach {_names(by_state['unreachable'])}",
            "check that the engine listens on spec.engine.port and that the NetworkPolicy "
            "admits the operator (networkPolicy.namespaces); snooze check --engine URL checks "
            "one from where its port can be reached",
        )
    if no_sleep:
        return failure(
            subject,
            "engines",
            f"{said}; {_names(no_sleep)} run without sleep mode or dev mode",
            "start vLLM with --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1; snooze check "
            "--engine URL --pod NAMESPACE/NAME says which",
        )
    doubtful = [s for s in ("failed", "unknown", "unready") if s in by_state]
    if doubtful or unseen:
        parts = [f"{_names(by_state[s])} {s}" for s in doubtful]
        if unseen:
            parts.append(f"{_names(unseen)} not seen by the operator yet")
        return warning(subject, "engines", f"{said}; {'; '.join(parts)}", _ENGINES_FIX)
    return ok(subject, "engines", said)


def _names(names: Sequence[str]) -> str:
    shown = ", ".join(sorted(names)[:SHOWN])
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return f"{shown}{more}"


# -- GPU pools -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Member:
    pod: JSON
    info: PodInfo

    @property
    def node(self) -> str:
        return str((self.pod.get("spec") or {}).get("nodeName") or "")


def members(
    pool: JSON, pools: Sequence[JSON], models: Sequence[JSON], pods: Sequence[JSON]
) -> list[Member]:
    """The pool's members as the operator counts them (kube.pods.pool_name_of): pods of its
    namespace's models labelled with its name, referencing its ResourceClaim, or whose model
    names it in spec.pool."""
    meta = pool.get("metadata") or {}
    namespace, name = meta.get("namespace"), meta.get("name")
    claims: dict[str, str] = {}
    for other in sorted(pools, key=lambda p: str((p.get("metadata") or {}).get("name"))):
        other_meta = other.get("metadata") or {}
        claim = (other.get("spec") or {}).get("resourceClaimName")
        if (
            other_meta.get("namespace") == namespace
            and isinstance(claim, str)
            and claim not in claims
        ):
            claims[claim] = str(other_meta.get("name"))
    found: dict[str, Member] = {}
    for each in models:
        if (each.get("metadata") or {}).get("namespace") != namespace:
            continue
        spec = spec_of(each)
        for pod in selected(each, pods):
            info = pod_info(pod)
            if pool_name_of(info, spec, claims) == name:
                found[info.name] = Member(pod=pod, info=info)
    return [found[key] for key in sorted(found)]


def pool_subject(pool: JSON) -> Subject:
    meta = pool.get("metadata") or {}
    return Subject(
        kind=Kind.POOL, namespace=str(meta.get("namespace") or ""), name=str(meta.get("name"))
    )


def pool(body: JSON, found: Sequence[Member]) -> list[Result]:
    """The `pool`, `members-node` and `members-claim` checks of one GPUPool."""
    subject = pool_subject(body)
    return [
        _pool_status(subject, body),
        _one_node(subject, found),
        _one_claim(subject, body, found),
    ]


def _pool_status(subject: Subject, body: JSON) -> Result:
    raw = body.get("status")
    if not raw:
        return warning(
            subject, "pool", "the operator has not reported on it", "check the operator's lines"
        )
    status = parse_pool_status(raw)
    conditions = {c.type: c for c in status.conditions}
    said = f"{status.used or 'nothing'} used, {status.awake} awake, {status.waiting} waiting"
    bad = _conditions(conditions, POOL_FAILING)
    if bad:
        return failure(subject, "pool", f"{said}; {bad}", "kubectl describe gpool: its conditions")
    doubtful = _conditions(conditions, POOL_WARNING)
    if doubtful:
        return warning(subject, "pool", f"{said}; {doubtful}", "kubectl describe gpool")
    return ok(subject, "pool", said)


def _one_node(subject: Subject, found: Sequence[Member]) -> Result:
    if not found:
        return warning(
            subject,
            "members-node",
            "no members: no pod of a model of its namespace names it",
            "label the engines' pods snooze.dev/pool, reference its ResourceClaim, or set "
            "their model's spec.pool.name",
        )
    nodes: dict[str, list[str]] = {}
    for member in found:
        nodes.setdefault(member.node, []).append(member.info.name)
    unscheduled = nodes.pop("", [])
    pending = f"; {_names(unscheduled)} not scheduled yet" if unscheduled else ""
    if len(nodes) > 1:
        where = "; ".join(f"{node}: {_names(names)}" for node, names in sorted(nodes.items()))
        return failure(
            subject,
            "members-node",
            f"its members run on {len(nodes)} nodes ({where}): a pool is one device",
            "pin them to one node (nodeSelector), or give them one ResourceClaim "
            "(spec.resourceClaimName)",
        )
    if not nodes:
        return warning(
            subject,
            "members-node",
            f"{len(found)} members, none scheduled{pending}",
            "wait for them to be scheduled",
        )
    [(node, names)] = nodes.items()
    return ok(subject, "members-node", f"{len(names)} members on node {node}{pending}")


def _one_claim(subject: Subject, body: JSON, found: Sequence[Member]) -> Result:
    claim = (body.get("spec") or {}).get("resourceClaimName")
    referenced: dict[str, list[str]] = {}
    for member in found:
        for each in sorted(member.info.claims) or [""]:
            referenced.setdefault(each, []).append(member.info.name)
    if isinstance(claim, str) and claim:
        outside = sorted({m.info.name for m in found if claim not in m.info.claims})
        if outside:
            return failure(
                subject,
                "members-claim",
                f"{_names(outside)} are members but do not reference its ResourceClaim {claim}: "
                "they are not on its device",
                f"reference ResourceClaim {claim} in their pods (spec.resourceClaims), or take "
                "them out of the pool",
            )
        return ok(subject, "members-claim", f"every member references ResourceClaim {claim}")
    named = {c: names for c, names in referenced.items() if c}
    if len(named) > 1:
        where = "; ".join(f"{c}: {_names(n)}" for c, n in sorted(named.items()))
        return failure(
            subject,
            "members-claim",
            f"its members reference {len(named)} ResourceClaims ({where}): several devices",
            "give them one ResourceClaim and name it in spec.resourceClaimName",
        )
    if named:
        [(shared, _)] = named.items()
        return warning(
            subject,
            "members-claim",
            f"its members share ResourceClaim {shared}, which the pool does not name",
            f"set spec.resourceClaimName: {shared}",
        )
    return ok(
        subject,
        "members-claim",
        "no ResourceClaim: the members share their node's GPU (time-slicing), which must "
        "have only one",
    )
