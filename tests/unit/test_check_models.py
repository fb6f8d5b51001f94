"""`snooze check`'s judgements of each InferenceModel (its pods, its engines as the operator's
status shows them) and of each GPUPool (its members on one node and one claim), as pure tables
(check/modeljudge.py)."""

from __future__ import annotations

from typing import Any

import builders
import pytest

from snooze.check.modeljudge import members, model, pool, selected
from snooze.check.report import Level

LABELS = {"app": "chat"}


def pod(
    name: str,
    *,
    labels: dict[str, str] | None = None,
    ready: bool = True,
    node: str = "gpu-1",
    claims: tuple[str, ...] = (),
    namespace: str = "llm",
) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if node:
        spec["nodeName"] = node
    if claims:
        spec["resourceClaims"] = [{"name": c, "resourceClaimName": c} for c in claims]
    ready_condition = {"type": "Ready", "status": "True" if ready else "False"}
    return builders.pod(
        {"name": "vllm"},
        name=name,
        namespace=namespace,
        uid=name,
        labels=labels or LABELS,
        spec=spec,
        status=builders.running("10.0.0.1", ready_condition),
    )


def condition(kind: str, status: str, message: str = "") -> dict[str, Any]:
    return {
        "type": kind,
        "status": status,
        "reason": "Because",
        "message": message,
        "lastTransitionTime": "2026-12-01T00:00:00Z",
    }


def im(
    name: str = "chat",
    *,
    status: dict[str, Any] | None = None,
    spec: dict[str, Any] | None = None,
    generation: int = 1,
) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "llm", "name": name, "generation": generation},
        "spec": spec or {"selector": {"matchLabels": LABELS}},
        **({"status": status} if status is not None else {}),
    }


def status(*entries: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {
        "phase": "Awake",
        "modelName": "chat",
        "engines": len(entries),
        "pods": list(entries),
        "observedGeneration": 1,
        **fields,
    }


def entry(name: str, state: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "state": state, **fields}


def lines(body: dict[str, Any], pods: list[dict[str, Any]], **options: Any) -> dict[str, Any]:
    options.setdefault("watched", ())
    options.setdefault("operator", True)
    return {r.check: r for r in model(body, selected(body, pods), **options)}


def test_a_model_with_its_engines_awake() -> None:
    found = lines(im(status=status(entry("chat-0", "awake"), entry("chat-1", "asleep"))),
                  [pod("chat-0"), pod("chat-1")])  # fmt: skip
    assert {check: r.level for check, r in found.items()} == {
        "model": Level.OK,
        "pods": Level.OK,
        "engines": Level.OK,
    }
    assert found["engines"].message == "as the operator last saw them: 1 asleep, 1 awake"
    assert found["pods"].message == "2 match its selector, 2 ready"


@pytest.mark.parametrize(
    ("body", "pods", "options", "check", "level", "words"),
    [
        (im(), [pod("chat-0")], {}, "model", Level.FAILURE, "has not reported on it"),
        (im(), [pod("chat-0")], {"operator": False, "watched": None}, "model", Level.FAILURE,
         "no operator was found"),
        (im(status=status()), [], {"watched": ("other",)}, "model", Level.FAILURE,
         "watches only other"),
        (im(spec={"selector": {}}), [], {}, "model", Level.FAILURE, "its spec is invalid"),
        (im(status=status(conditions=[condition("Conflict", "True", "taken by llm/first")])),
         [], {}, "model", Level.FAILURE, "Conflict: taken by llm/first"),
        (im(status=status(conditions=[condition("KnownBug", "True", "lora-level2")])),
         [], {}, "model", Level.WARNING, "KnownBug: lora-level2"),
        (im(status=status(conditions=[condition("KnownBug", "False")])), [], {}, "model",
         Level.OK, "phase Awake"),
        (im(status=status(conditions=[condition("PickerReadable", "False", "401 from epp")])),
         [], {}, "model", Level.WARNING, "PickerReadable: 401 from epp"),
        (im(status=status(conditions=[condition("PickerReadable", "True")])), [], {}, "model",
         Level.OK, "phase Awake"),
        (im(status=status(), generation=2), [], {}, "model", Level.WARNING,
         "not reported on generation 2"),
        (im(status=status()), [], {}, "pods", Level.WARNING, "no pod in llm matches"),
        (im(status=status()), [pod("chat-0")], {}, "pods", Level.WARNING, "operator counts 0"),
        (im(status=status()), [pod("chat-0", labels={"app": "other"})], {}, "pods",
         Level.WARNING, "no pod"),
        (im(status=status()), [pod("chat-0", namespace="elsewhere")], {}, "pods",
         Level.WARNING, "no pod"),
        (im(status=status(entry("chat-0", "unreachable"))), [pod("chat-0")], {}, "engines",
         Level.FAILURE, "cannot reach chat-0"),
        (im(status=status(entry("chat-0", "awake", sleepFailureReason="SleepModeDisabled"))),
         [pod("chat-0")], {}, "engines", Level.FAILURE, "without sleep mode or dev mode"),
        (im(status=status(entry("chat-0", "failed"))), [pod("chat-0")], {}, "engines",
         Level.WARNING, "chat-0 failed"),
        (im(status=status(entry("chat-0", "awake"), engines=2)),
         [pod("chat-0"), pod("chat-1")], {}, "engines", Level.WARNING,
         "chat-1 not seen by the operator yet"),
    ],
)  # fmt: skip
def test_model_lines(
    body: dict[str, Any],
    pods: list[dict[str, Any]],
    options: dict[str, Any],
    check: str,
    level: Level,
    words: str,
) -> None:
    found = lines(body, pods, **options)[check]
    assert found.level is level and words in found.message, found


def test_without_a_status_there_is_no_engines_line() -> None:
    assert set(lines(im(), [pod("chat-0")])) == {"model", "pods"}


def gpool(name: str = "shared", claim: str | None = None, **status: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"memory": "80Gi"}
    if claim:
        spec["resourceClaimName"] = claim
    return {
        "metadata": {"namespace": "llm", "name": name},
        "spec": spec,
        **({"status": status} if status else {}),
    }


POOLED = {"selector": {"matchLabels": LABELS}, "pool": {"name": "shared"}}


def pool_lines(
    body: dict[str, Any], pods: list[dict[str, Any]], *, spec: dict[str, Any] = POOLED
) -> dict[str, Any]:
    models = [im(spec=spec)]
    found = members(body, [body], models, pods)
    return {r.check: r for r in pool(body, found)}


def test_members_on_one_node_and_one_claim() -> None:
    found = pool_lines(
        gpool(claim="gpu-a", used="36Gi/80Gi", awake=1),
        [pod("chat-0", claims=("gpu-a",)), pod("chat-1", claims=("gpu-a",))],
    )
    assert {check: r.level for check, r in found.items()} == dict.fromkeys(
        ("pool", "members-node", "members-claim"), Level.OK
    )
    assert found["members-node"].message == "2 members on node gpu-1"


@pytest.mark.parametrize(
    ("body", "pods", "check", "level", "words"),
    [
        (gpool(), [pod("chat-0", node="gpu-1"), pod("chat-1", node="gpu-2")], "members-node",
         Level.FAILURE, "2 nodes (gpu-1: chat-0; gpu-2: chat-1): a pool is one device"),
        (gpool(), [pod("chat-0"), pod("chat-1", node="")], "members-node", Level.OK,
         "chat-1 not scheduled yet"),
        (gpool(), [], "members-node", Level.WARNING, "no members"),
        (gpool(claim="gpu-a"), [pod("chat-0", claims=("gpu-a",)), pod("chat-1")],
         "members-claim", Level.FAILURE, "chat-1 are members but do not reference"),
        (gpool(), [pod("chat-0", claims=("gpu-a",)), pod("chat-1", claims=("gpu-b",))],
         "members-claim", Level.FAILURE, "2 ResourceClaims"),
        (gpool(), [pod("chat-0", claims=("gpu-a",)), pod("chat-1", claims=("gpu-a",))],
         "members-claim", Level.WARNING, "share ResourceClaim gpu-a, which the pool does not name"),
        (gpool(), [pod("chat-0")], "members-claim", Level.OK, "time-slicing"),
        (gpool(), [pod("chat-0")], "pool", Level.WARNING, "has not reported"),
        (gpool(conditions=[condition("Overcommitted", "True", "needs 90Gi")]), [pod("chat-0")],
         "pool", Level.FAILURE, "Overcommitted: needs 90Gi"),
        (gpool(conditions=[condition("MemoryNotFreed", "True", "chat-0 lies")]),
         [pod("chat-0")], "pool", Level.WARNING, "MemoryNotFreed"),
    ],
)  # fmt: skip
def test_pool_lines(
    body: dict[str, Any], pods: list[dict[str, Any]], check: str, level: Level, words: str
) -> None:
    found = pool_lines(body, pods)[check]
    assert found.level is level and words in found.message, found


def test_members_are_counted_as_the_operator_counts_them() -> None:
    """By the snooze.dev/pool label, by the pool's ResourceClaim, or by the model's spec.pool;
    only the pods of its namespace's models."""
    body = gpool(claim="gpu-a")
    plain = {"selector": {"matchLabels": LABELS}}
    pods = [
        pod("by-label", labels={**LABELS, "snooze.dev/pool": "shared"}),
        pod("by-claim", claims=("gpu-a",)),
        pod("neither"),
        pod("other-pool", labels={**LABELS, "snooze.dev/pool": "another"}),
    ]
    found = members(body, [body], [im(spec=plain)], pods)
    assert [m.info.name for m in found] == ["by-claim", "by-label"]
    assert [m.info.name for m in members(body, [body], [im(spec=POOLED)], pods)] == [
        "by-claim",
        "by-label",
        "neither",
    ]
