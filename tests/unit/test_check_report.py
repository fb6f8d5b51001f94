"""`snooze check`'s report: one line per check under its subject, the counts, the exit status,
and the JSON shape docs/check.md documents."""

from __future__ import annotations

import json
import re
from pathlib import Path

import docs_pages
import pytest

from snooze.check.report import (
    CHECKS,
    CLUSTER,
    FORMAT_VERSION,
    Kind,
    Level,
    Result,
    Subject,
    as_json,
    exit_code,
    failure,
    json_text,
    ok,
    text,
    warning,
)

ENGINE = Subject(kind=Kind.ENGINE, name="http://10.0.0.7:8000")
MODEL = Subject(kind=Kind.MODEL, namespace="llm", name="chat")


@pytest.mark.parametrize(
    ("levels", "code"),
    [
        ([], 0),
        ([Level.OK], 0),
        ([Level.OK, Level.WARNING], 0),
        ([Level.WARNING, Level.FAILURE], 1),
        ([Level.FAILURE], 1),
    ],
)
def test_only_a_failure_fails(levels: list[Level], code: int) -> None:
    results = [Result(subject=CLUSTER, check="crds", level=level, message="m") for level in levels]
    assert exit_code(results) == code


def test_one_line_per_check_under_its_subject_then_the_counts() -> None:
    results = [
        ok(ENGINE, "engine", "vLLM 0.33.0 answers", version="0.33.0"),
        failure(ENGINE, "dev-mode", "/is_sleeping answers 404", "set VLLM_SERVER_DEV_MODE=1"),
        warning(MODEL, "pods", "no pod matches", "label them"),
    ]
    assert text(results) == (
        "Engine http://10.0.0.7:8000\n"
        "  ok       engine: vLLM 0.33.0 answers\n"
        "  FAILURE  dev-mode: /is_sleeping answers 404 Fix: set VLLM_SERVER_DEV_MODE=1\n"
        "InferenceModel llm/chat\n"
        "  warning  pods: no pod matches Fix: label them\n"
        "1 ok, 1 warning, 1 failure\n"
    )


def test_what_an_engine_said_cannot_break_a_line_or_reach_the_terminal() -> None:
    said = "answered 'bad\nline\r\x1b[2Jcleared'"
    [_, line, _] = text([failure(ENGINE, "engine", said, "fix\nit")]).splitlines()
    assert "\x1b" not in line and "\r" not in line
    assert line.endswith("answered 'bad line  [2Jcleared' Fix: fix it")


def test_the_json_document_has_the_documented_shape() -> None:
    results = [
        ok(ENGINE, "cycle-wake", "woke in 0.12s", wake_seconds=0.12),
        failure(MODEL, "engines", "cannot reach chat-0", "check the NetworkPolicy"),
    ]
    document = json.loads(json_text(results))
    assert document == as_json(results)
    assert document == {
        "version": FORMAT_VERSION,
        "passed": False,
        "counts": {"ok": 1, "warning": 0, "failure": 1},
        "checks": [
            {
                "subject": {"kind": "Engine", "name": "http://10.0.0.7:8000"},
                "check": "cycle-wake",
                "level": "ok",
                "message": "woke in 0.12s",
                "fix": "",
                "data": {"wake_seconds": 0.12},
            },
            {
                "subject": {"kind": "InferenceModel", "namespace": "llm", "name": "chat"},
                "check": "engines",
                "level": "failure",
                "message": "cannot reach chat-0",
                "fix": "check the NetworkPolicy",
                "data": {},
            },
        ],
    }


def test_a_users_name_is_never_taken_for_a_word_of_ours() -> None:
    """A model called "Cluster" in a namespace called "Engine" stays a model."""
    named = Subject(kind=Kind.MODEL, namespace="Engine", name="Cluster")
    assert named.as_json() == {"kind": "InferenceModel", "namespace": "Engine", "name": "Cluster"}
    assert named != CLUSTER
    assert text([ok(named, "model", "fine"), ok(CLUSTER, "crds", "fine")]).splitlines()[:3] == [
        "InferenceModel Engine/Cluster",
        "  ok       model: fine",
        "Cluster",
    ]


def test_every_check_is_documented_and_every_documented_check_is_one() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "check.md").read_text()
    rows = [line for line in page.splitlines() if line.startswith("| `")]
    documented = {name for row in rows for name in re.findall(r"`([a-z-]+)`", row.split("|")[1])}
    assert documented == CHECKS
    with pytest.raises(ValueError, match="not a check's name"):
        ok(CLUSTER, "everything", "fine")


def test_the_pages_json_sample_has_the_documents_shape() -> None:
    [block] = [b for b in docs_pages.blocks(docs_pages.read("docs/check.md")) if b.lang == "json"]
    sample = json.loads(block.body)
    [entry] = sample["checks"]
    subject = Subject(kind=Kind.MODEL, namespace="default", name="qwen3-8b")
    real = as_json([ok(subject, entry["check"], entry["message"])] * 8)
    assert sample == {**real, "checks": real["checks"][:1]}
