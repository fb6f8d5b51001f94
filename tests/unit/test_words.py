"""Each word of the status, the Events and the readiness gate is spelled once, in the API's
enums (snooze.api.conditions, eventreasons, reasons) or the policy's (ActionReason): the
operator's code names them by member, and the docs use no word that is not one of them."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path

import pytest

from snooze.api.conditions import (
    MODEL_CONDITIONS,
    POOL_CONDITIONS,
    ConditionReason,
    ConditionType,
    GateReason,
)
from snooze.api.eventreasons import RESOLVED, EventReason
from snooze.api.gpupool import GPUPoolStatus, PoolMember, PoolMemberState
from snooze.api.models import EngineState, Phase
from snooze.api.modelstatus import Condition, PodState, PodStatus
from snooze.api.reasons import FailureReason
from snooze.policy.pool.types import MemberState
from snooze.policy.sleep import ActionReason

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "operator" / "snooze"
ENUMS: tuple[type[StrEnum], ...] = (
    ConditionType,
    ConditionReason,
    GateReason,
    EventReason,
    FailureReason,
    ActionReason,
)
WORDS = {member.value for enum in ENUMS for member in enum}
# api/ defines the words; the sandbox and the simulator play the API server and the engines,
# and speak their words (HTTP's Conflict and Unauthorized, vLLM's states).
NOT_SCANNED = ("api", "sandbox", "sim")
ALLOWED = {
    # The Pod's own Ready condition, Kubernetes' word, read and (by the demo) written.
    ("kube/pods.py", "Ready"),
    ("demo/run.py", "Ready"),
    ("demo/sampler.py", "Ready"),
    ("demo/controller.py", "Ready"),
}
MULTI_PART = re.compile(r"^[A-Z][a-z0-9]*(?:[A-Z][A-Za-z0-9]*)+$|^[A-Z]{2,}[a-z]")
WORD_KEYS = {"type", "reason"}


def _in_word_place(node: ast.Constant, parents: dict[ast.AST, ast.AST]) -> bool:
    """Whether a one-part word sits where a condition's type or reason or an Event's reason
    goes: a type= or reason= argument, an Event's reason, a comparison with a .type or a
    .reason, or a get("type") or get("reason")."""
    parent = parents.get(node)
    if isinstance(parent, ast.keyword):
        return parent.arg in WORD_KEYS
    if isinstance(parent, ast.Call):
        func = parent.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        return name in ("emit", "_emit") and parent.args[1:2] == [node]
    if isinstance(parent, ast.Compare):
        return any(_names_a_word(side) for side in [parent.left, *parent.comparators])
    return False


def _names_a_word(node: ast.expr) -> bool:
    if isinstance(node, ast.Attribute):
        return node.attr in WORD_KEYS
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        args = node.args[:1]
        return node.func.attr == "get" and any(
            isinstance(a, ast.Constant) and a.value in WORD_KEYS for a in args
        )
    return False


def _named(node: ast.expr, name: str) -> bool:
    return (isinstance(node, ast.Name) and node.id == name) or (
        isinstance(node, ast.Attribute) and node.attr == name
    )


def bare_words(source: str) -> Iterator[tuple[int, str]]:
    """The words of the enums that `source` spells as string literals: a word of two parts
    or more anywhere (but in a docstring, or as a metric's label value, which are the metrics
    reference's words), and a one-part word where a type or reason goes."""
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    docstrings = {
        id(n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)
    }
    # An enum's own members (ActionReason, beside the policy's Action) are where words are spelled.
    members = {
        id(n.value)
        for c in ast.walk(tree)
        if isinstance(c, ast.ClassDef) and any(_named(b, "StrEnum") for b in c.bases)
        for n in c.body
        if isinstance(n, ast.Assign)
    }
    labels = {
        id(c)
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "labels"
        for c in ast.walk(n)
    }
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            continue
        if node.value not in WORDS or id(node) in docstrings | labels | members:
            continue
        if MULTI_PART.match(node.value) or _in_word_place(node, parents):
            yield node.lineno, node.value


def test_the_scan_finds_a_word_spelled_bare() -> None:
    source = '''
def f(emit, c, body):
    """A docstring may say WakeFailed."""
    emit("Warning", "Slept", "message")
    if c.type == "Ready" or body.get("reason") == "Valid":
        return Value(type="Awake", reason="NoPods")
    metrics.labels("ns", "ScaledToZero").inc()
    return "x" + "MakingRoom"


class Why(StrEnum):
    IDLE = "Idle"
    MAKE_ROOM = "MakeRoom"
'''
    assert sorted(bare_words(source)) == [
        (4, "Slept"),
        (5, "Ready"),
        (5, "Valid"),
        (6, "Awake"),
        (6, "NoPods"),
        (8, "MakingRoom"),
    ]


def _modules() -> list[Path]:
    return sorted(
        p for p in PACKAGE.rglob("*.py") if p.relative_to(PACKAGE).parts[0] not in NOT_SCANNED
    )


def test_no_condition_event_or_failure_word_is_spelled_bare_outside_the_api() -> None:
    found = [
        f"{path.relative_to(PACKAGE)}:{line}: {word!r}"
        for path in _modules()
        for line, word in bare_words(path.read_text())
        if (path.relative_to(PACKAGE).as_posix(), word) not in ALLOWED
    ]
    assert not found, (
        "use the member of snooze.api's enums (conditions.py, eventreasons.py, reasons.py) "
        "or ActionReason, not the string:\n" + "\n".join(found)
    )


def test_each_word_has_one_member_in_its_enum() -> None:
    for enum in ENUMS:
        values = [m.value for m in enum]
        assert len(values) == len(set(values)), enum
    assert set(RESOLVED.values()) <= set(EventReason)


def _listed(description: str, words: set[str]) -> set[str]:
    return {w for w in re.findall(r"[A-Za-z]+", description) if w in words}


def test_the_crd_lists_the_condition_types_the_operator_writes() -> None:
    """The CRD's (and so docs/reference/crd.md's) description of conditions[].type names every
    type a model and a pool carry, and no other."""
    described = Condition.model_fields["type"].description or ""
    for_model, _, for_pool = described.partition("on a GPUPool")
    types = {t.value for t in ConditionType}
    assert _listed(for_model, types) == {t.value for t in MODEL_CONDITIONS}
    assert _listed(for_pool, types) == {t.value for t in POOL_CONDITIONS}
    pool_field = GPUPoolStatus.model_fields["conditions"].description or ""
    assert _listed(pool_field, types) == {t.value for t in POOL_CONDITIONS}
    page = (ROOT / "docs" / "reference" / "crd.md").read_text()
    assert all(f"{t.value} " in page or f"{t.value}," in page for t in ConditionType)


def test_the_crd_lists_the_pod_states_the_status_writes() -> None:
    described = PodStatus.model_fields["state"].description or ""
    states = {s.value for s in EngineState} | {s.value for s in PodState}
    assert _listed(described, states) == states


def test_the_crd_and_the_pools_page_list_the_member_states_the_pool_writes() -> None:
    described = PoolMember.model_fields["state"].description or ""
    states = {s.value for s in PoolMemberState}
    assert _listed(described, states) == states
    page = (ROOT / "docs" / "pools.md").read_text()
    assert all(f"`{state}`" in page for state in states)
    # What the policy says of a member is one of them, as it is shown.
    assert {s.value for s in MemberState} <= states


# Backticked CamelCase words in the docs that are no word of Snooze's own: other programs'
# (Kubernetes, Python, vLLM, SGLang, the Inference Extension), the kinds, the spec's values
# and the alerts' names. A misspelled condition, reason or Event is in neither list.
SPEC_WORDS = {
    "DoesNotExist",
    "NotIn",
    "LeastRecentlyUsed",
    "FallBack",
    "NeverSleep",
    "SleepAnyway",
    # The integrity checks' words, which WakeVerified gives as its reasons.
    "NotDeterministic",
    "WeightsUnavailable",
}
OTHER_WORDS = {
    "BadRequestError",
    "ClusterKopfPeering",
    "KopfPeering",
    "ContainersReady",
    "InferenceModel",
    "InferencePool",
    "InternalServerError",
    "IsPodReady",
    "KeyError",
    "MetricsEndpointAuth",
    "MetricsPort",
    "NaN",
    "PauseGenerationReqInput",
    "PauseMode",
    "PoolLabelsMatch",
    "RequestValidationError",
    "SimulatorHost",
    "StatefulSet",
    "ValueError",
}
ALERT = re.compile(r"^Snooze[A-Z]\w+$")


def _doc_pages() -> list[Path]:
    return [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]


@pytest.mark.parametrize("page", _doc_pages(), ids=lambda p: p.name)
def test_the_docs_name_only_words_the_enums_spell(page: Path) -> None:
    known = WORDS | {p.value for p in Phase} | SPEC_WORDS | OTHER_WORDS
    backticked = re.findall(r"`([A-Z][a-z0-9]+(?:[A-Z][A-Za-z0-9]*)+)`", page.read_text())
    unknown = sorted({w for w in backticked if w not in known and not ALERT.match(w)})
    assert not unknown, (
        f"{page.name} names {unknown}: no condition, reason or Event of Snooze's is spelled so "
        "(see snooze/api/conditions.py, eventreasons.py, reasons.py)"
    )
