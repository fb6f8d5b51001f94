"""No raw status dict is read in the operator, the gateway or the demo: an InferenceModel's or a
GPUPool's status is read only through the parse functions of the pydantic models that generate
the CRDs, so that what each reads back is typed, checked and read leniently, as it was written,
and the status's format lives in one place."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel

from snooze.api.gpupool import GPUPoolSpec, GPUPoolStatus
from snooze.api.models import InferenceModelSpec
from snooze.api.modelstatus import InferenceModelStatus

PACKAGE = Path(__file__).resolve().parents[2] / "operator" / "snooze"
# Every part that reads what the operator wrote.
READERS = ("operator", "gateway", "demo")
PARSERS = {"parse_status", "parse_pool_status"}
STATUSES: tuple[type[BaseModel], ...] = (InferenceModelStatus, GPUPoolStatus)
SPECS: tuple[type[BaseModel], ...] = (InferenceModelSpec, GPUPoolSpec)


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
# hostCopy...), and none a spec uses too (modelName: the gateway lists the name an invalid spec
# asks for). Words such as "phase" or "name" are everybody's.
SPEC_WORDS = {n for model in SPECS for n in wire_names(model)}
STATUS_WORDS = {
    n for model in STATUSES for n in wire_names(model) if n != n.lower() and n not in SPEC_WORDS
}


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


def reader_modules() -> list[Path]:
    return sorted(path for part in READERS for path in (PACKAGE / part).rglob("*.py"))


@pytest.mark.parametrize(
    "path", reader_modules(), ids=lambda p: str(p.relative_to(PACKAGE).as_posix())
)
def test_status_is_read_only_through_the_api_types(path: Path) -> None:
    found = raw_reads(path.read_text())
    assert not found, (
        f"{path.relative_to(PACKAGE)} reads a status as a raw dict: {found}. Read it with "
        "parse_status or parse_pool_status (snooze/api), and use the model's fields; a pod "
        "with pod_info (snooze/kube/pods.py)"
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
    assert {"lastWakeSeconds", "scaledToZeroTime", "usedBytes", "waitingModels"} <= STATUS_WORDS
    parts = {path.relative_to(PACKAGE).parts[0] for path in reader_modules()}
    assert parts == set(READERS)
    assert len(reader_modules()) > 70
