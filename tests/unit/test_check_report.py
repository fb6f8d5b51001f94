"""`snooze check`'s report: one line per check under its subject, the counts, the exit status,
and the JSON shape docs/check.md documents."""

from __future__ import annotations

import json

import pytest

from snooze.check.report import (
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
    results = [Result(subject=CLUSTER, check="c", level=level, message="m") for level in levels]
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
