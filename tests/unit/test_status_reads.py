"""No raw status dict is read in the operator: an InferenceModel's or a GPUPool's status is read
only through the parse functions of the pydantic models that generate the CRDs, so that what a
restarted operator reads back is typed, checked and read leniently, as it was written."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel

from snooze.api.gpupool import GPUPoolStatus
from snooze.api.modelstatus import InferenceModelStatus

OPERATOR = Path(__file__).resolve().parents[2] / "operator" / "snooze" / "operator"
PARSERS = {"parse_status", "parse_pool_status"}
STATUSES: tuple[type[BaseModel], ...] = (InferenceModelStatus, GPUPoolStatus)


def wire_names(model: type[BaseModel]) -> set[str]:
    """The status's field names as the API holds them, the nested models' too."""
    names: set[str] = set()
    for name, field in model.model_fields.items():
        names.add(field.alias or name)
        for nested in _models_in(field.annotation):
            names |= wire_names(nested)
    return names


def _models_in(annotation: object) -> Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for argument in getattr(annotation, "__args__", ()):
        yield from _models_in(argument)


# Only the names no other part of a Kubernetes object uses: camelCase ones (lastSleepTime,
# hostCopy...). Words such as "phase" or "name" are everybody's.
STATUS_WORDS = {n for model in STATUSES for n in wire_names(model) if n != n.lower()}


def raw_reads(source: str) -> list[str]:
    """Where `source` reads a status without a parse function: a `status` key read from a
    body (`body["status"]`, `body.get("status")`) or a kopf.Status handed to a handler, other
    than as the argument of a parse function; and any status field named by its wire name."""
    tree = ast.parse(source)
    parsed = {
        id(arg)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and _called(node) in PARSERS
        for arg in node.args
    }
    kopf_statuses = {
        arg.arg
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        for arg in node.args.args + node.args.kwonlyargs
        if arg.annotation is not None and ast.unparse(arg.annotation) == "kopf.Status"
    }
    found = []
    for node in ast.walk(tree):
        if id(node) in parsed:
            continue
        if _reads_status_key(node) or (isinstance(node, ast.Name) and node.id in kopf_statuses):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value in STATUS_WORDS
        ):
            found.append(f"line {node.lineno}: the status field {node.value!r} by name")
    return found


def _called(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _reads_status_key(node: ast.AST) -> bool:
    if isinstance(node, ast.Subscript):
        key = node.slice
        return isinstance(key, ast.Constant) and key.value == "status"
    if isinstance(node, ast.Call) and _called(node) == "get" and node.args:
        key = node.args[0]
        return isinstance(key, ast.Constant) and key.value == "status"
    return False


def operator_modules() -> list[Path]:
    return sorted(OPERATOR.rglob("*.py"))


@pytest.mark.parametrize("path", operator_modules(), ids=lambda p: str(p.relative_to(OPERATOR)))
def test_the_operator_reads_status_only_through_its_models(path: Path) -> None:
    found = raw_reads(path.read_text())
    assert not found, (
        f"{path.name} reads a status as a raw dict: {found}. Read it with parse_status or "
        "parse_pool_status (snooze/api), and use the model's fields"
    )


@pytest.mark.parametrize(
    "leak",
    [
        'memory = rebuild(dict(body.get("status") or {}))',
        'phase = body["status"]["phase"]',
        'evictions = written.get("evictions") or written["hostCopy"]',
        "def hand_back(status: kopf.Status) -> None:\n    release(status=dict(status))",
    ],
)
def test_the_check_would_see_a_leak(leak: str) -> None:
    assert raw_reads(leak)


def test_what_the_check_lets_through() -> None:
    assert not raw_reads('written = parse_status(body.get("status"))')
    assert not raw_reads(
        "def hand_back(status: kopf.Status) -> None:\n    release(status=parse_status(status))"
    )
    assert not raw_reads('pod = pod_info(body)\nready = pod.ready\nsays = "awake"')


def test_the_check_knows_the_status_words() -> None:
    assert {"lastSleepTime", "hostCopy", "lastTransitionTime", "observedGeneration"} <= (
        STATUS_WORDS
    )
    assert len(operator_modules()) > 20
