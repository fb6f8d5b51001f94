"""`snooze check --engine`'s judgements of a vLLM engine's answers, check by check: pure tables of
answers in, levels and words out (check/vllmjudge.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from snooze.check.asking import Asked
from snooze.check.report import Kind, Level, Subject
from snooze.check.vllmjudge import (
    PodSeen,
    ServerInfo,
    checker_present,
    dev_mode,
    engine,
    known_bugs,
    metrics,
    server_info,
    sleep_mode,
    version_of,
    weight_checker,
)
from snooze.engine.activity import ActivitySnapshot, SleepState

URL = "http://10.0.0.7:8000"
SUBJECT = Subject(kind=Kind.ENGINE, name=URL)
NOT_FOUND = Asked(status=404, body=b'{"detail":"Not Found"}')


def answer(status: int, body: Any) -> Asked:
    text = body if isinstance(body, bytes) else json.dumps(body).encode()
    return Asked(status=status, body=text)


def pod(*args: str, env: list[dict[str, Any]] | None = None, **container: Any) -> PodSeen:
    spec = {"containers": [{"name": "vllm", "args": list(args), "env": env or [], **container}]}
    return PodSeen(namespace="llm", name="chat-0", spec=spec)


@pytest.mark.parametrize(
    ("asked", "level", "words"),
    [
        (answer(200, {"version": "0.33.0"}), Level.OK, "vLLM 0.33.0 answers"),
        (answer(200, {"version": "0.8.0"}), Level.OK, "vLLM 0.8.0 answers"),
        (answer(200, {"version": "0.7.3"}), Level.FAILURE, "needs 0.8.0 or later"),
        (answer(200, {"version": "0.33.1rc2.dev7+g1234.cu129"}), Level.OK, "0.33.1rc2"),
        (answer(200, {"version": "main"}), Level.WARNING, "cannot place"),
        (answer(200, {"version": 33}), Level.FAILURE, "not as vLLM does"),
        (answer(200, {"version": "x" * 65}), Level.FAILURE, "not as vLLM does"),
        (answer(200, {"version": "0.33\x1b[2J"}), Level.FAILURE, "not as vLLM does"),
        (answer(200, b"<html>nginx</html>"), Level.FAILURE, "/version answered 200"),
        (NOT_FOUND, Level.FAILURE, "not as vLLM does"),
        (Asked(failure="cannot connect to it"), Level.FAILURE, "kubectl port-forward"),
    ],
)
def test_the_engine_line(asked: Asked, level: Level, words: str) -> None:
    found = engine(SUBJECT, URL, asked)
    assert found.level is level and words in found.message + found.fix, found


def test_a_long_answer_is_shown_short() -> None:
    found = engine(SUBJECT, URL, answer(200, b"y" * 10_000))
    assert len(found.message) < 250


@pytest.mark.parametrize(
    ("asked", "seen", "level", "words"),
    [
        (answer(200, {"is_sleeping": False}), None, Level.OK, "awake now"),
        (answer(200, {"is_sleeping": True}), None, Level.OK, "asleep now"),
        (NOT_FOUND, None, Level.FAILURE, "without VLLM_SERVER_DEV_MODE=1"),
        (NOT_FOUND, pod(), Level.FAILURE, "pod llm/chat-0 does not set it"),
        (
            NOT_FOUND,
            pod(env=[{"name": "VLLM_SERVER_DEV_MODE", "value": "1"}]),
            Level.FAILURE,
            "is --engine that pod's port?",
        ),
        (answer(200, {"is_sleeping": "no"}), None, Level.FAILURE, 'not {"is_sleeping"'),
        (answer(500, b"boom"), None, Level.FAILURE, "answered 500"),
        (Asked(failure="no whole answer within 10s"), None, Level.FAILURE, "within 10s"),
    ],
)
def test_the_dev_mode_line(asked: Asked, seen: PodSeen | None, level: Level, words: str) -> None:
    found = dev_mode(SUBJECT, asked, seen)
    assert found.level is level and words in found.message, found
    if level is Level.FAILURE and asked.status == 404:
        assert "VLLM_SERVER_DEV_MODE=1" in found.fix and "private" in found.fix


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ([], False),
        ([{"name": "VLLM_SERVER_DEV_MODE", "value": "1"}], True),
        ([{"name": "VLLM_SERVER_DEV_MODE", "value": "0"}], False),
        ([{"name": "VLLM_SERVER_DEV_MODE", "valueFrom": {"configMapKeyRef": {}}}], None),
    ],
)
def test_what_a_pod_says_of_dev_mode(env: list[dict[str, Any]], expected: bool | None) -> None:
    assert pod(env=env).dev_mode is expected
    assert pod(envFrom=[{"configMapRef": {"name": "x"}}]).dev_mode is None


def config(**parts: Any) -> Asked:
    return answer(200, {"vllm_config": parts, "vllm_env": {}, "system_env": {}})


@pytest.mark.parametrize(
    ("asked", "expected"),
    [
        (None, None),
        (NOT_FOUND, None),
        (answer(200, b"not json"), None),
        (answer(200, {"vllm_config": 7}), None),
        (
            config(
                model_config={"enable_sleep_mode": True},
                parallel_config={"tensor_parallel_size": 2, "pipeline_parallel_size": 1},
                lora_config=None,
            ),
            ServerInfo(sleep_mode=True, tensor_parallel=2, pipeline_parallel=1, lora=False),
        ),
        (
            config(model_config={"enable_sleep_mode": False}, lora_config={"max_loras": 1}),
            ServerInfo(sleep_mode=False, tensor_parallel=None, pipeline_parallel=None, lora=True),
        ),
        (
            config(model_config={"enable_sleep_mode": "yes"}, parallel_config={"x": 1}),
            ServerInfo(sleep_mode=None, tensor_parallel=None, pipeline_parallel=None, lora=None),
        ),
        (
            # Before the JSON form (0.8.5 to 0.10.2): the configuration as text.
            answer(
                200, {"vllm_config": "model='m', tensor_parallel_size=4, pipeline_parallel_size=2"}
            ),
            ServerInfo(sleep_mode=None, tensor_parallel=4, pipeline_parallel=2, lora=None),
        ),
    ],
)
def test_what_server_info_says(asked: Asked | None, expected: ServerInfo | None) -> None:
    assert server_info(asked) == expected


ON = ServerInfo(sleep_mode=True, tensor_parallel=1, pipeline_parallel=1, lora=False)
OFF = ServerInfo(sleep_mode=False, tensor_parallel=1, pipeline_parallel=1, lora=False)
TEXT = ServerInfo(sleep_mode=None, tensor_parallel=1, pipeline_parallel=1, lora=None)


@pytest.mark.parametrize(
    ("info", "seen", "dev", "level", "words"),
    [
        (ON, None, True, Level.OK, "as /server_info says"),
        (OFF, pod("--enable-sleep-mode"), True, Level.FAILURE, "started without"),
        (TEXT, pod("serve", "m", "--enable-sleep-mode"), True, Level.OK, "in pod llm/chat-0"),
        (None, pod("serve", "m"), True, Level.FAILURE, "runs vLLM without --enable-sleep-mode"),
        (None, pod("--no-enable-sleep-mode"), True, Level.FAILURE, "without"),
        (None, pod("--config", "/etc/vllm.yaml"), True, Level.WARNING, "--config file"),
        (TEXT, None, True, Level.WARNING, "as text, without it (before vLLM 0.11.0)"),
        (None, None, True, Level.WARNING, "does not answer (vLLM before 0.8.5)"),
        (None, None, False, Level.WARNING, "as dev mode does not answer"),
        (None, PodSeen(namespace="llm", name="x", failure="403"), True, Level.WARNING, "not known"),
    ],
)
def test_the_sleep_mode_line(
    info: ServerInfo | None, seen: PodSeen | None, dev: bool, level: Level, words: str
) -> None:
    found = sleep_mode(SUBJECT, info, seen, dev)
    assert found.level is level and words in found.message, found
    if level is Level.FAILURE:
        assert "--enable-sleep-mode" in found.fix


@pytest.mark.parametrize(
    ("version", "info", "seen", "level", "rows"),
    [
        # How it runs is known: the rows of the operator's table that apply, by name.
        ("0.33.0", None, pod("-tp", "1"), Level.OK, []),
        ("0.27.1", None, pod("--enable-lora"), Level.WARNING, ["lora-level2"]),
        ("0.28.0", None, pod("--enable-lora"), Level.OK, []),
        ("0.28.0", None, pod("--enable-lora", "-tp", "2"), Level.WARNING, ["lora-tp-level1"]),
        ("0.24.0", None, pod("-pp", "2"), Level.WARNING, ["in-flight-sleep-parallel"]),
        ("0.25.0", None, pod("-pp", "2"), Level.OK, []),
        # LoRA at tensor parallel 2 before 0.28: level 1 and level 2 both break.
        (
            "0.27.1",
            None,
            pod("--enable-lora", "-tp", "2"),
            Level.FAILURE,
            ["lora-tp-level1", "lora-level2"],
        ),
        (
            "0.27.1",
            ServerInfo(sleep_mode=True, tensor_parallel=1, pipeline_parallel=1, lora=True),
            None,
            Level.WARNING,
            ["lora-level2"],
        ),
        # A level its release cannot wake from is said whatever it runs with.
        ("0.8.0", None, pod("-tp", "1"), Level.WARNING, []),
        ("0.10.1", None, pod("--enable-lora"), Level.WARNING, []),
        ("0.10.2", None, pod("--enable-lora"), Level.WARNING, ["lora-level2"]),
        # Not known: the rows its release has under some configuration, and how to say it.
        ("0.33.0", None, None, Level.WARNING, ["lora-tp-level1"]),
        # The text form says the parallel sizes: only LoRA is not known.
        ("0.24.0", TEXT, None, Level.WARNING, ["lora-level2"]),
        (
            "0.24.0",
            None,
            None,
            Level.WARNING,
            ["lora-tp-level1", "lora-level2", "in-flight-sleep-parallel"],
        ),
    ],
)
def test_the_known_bugs_line_reads_the_operators_table(
    version: str, info: ServerInfo | None, seen: PodSeen | None, level: Level, rows: list[str]
) -> None:
    found = known_bugs(SUBJECT, version, info, seen)
    assert found.level is level, found
    assert found.data.get("bugs", []) == rows
    for row in rows:
        assert row in found.message
    if seen is None and (info is None or info.lora is None):
        assert "--pod" in found.fix


def test_a_known_bug_says_what_snooze_does_about_it() -> None:
    found = known_bugs(SUBJECT, "0.27.1", None, pod("--enable-lora"))
    assert "level 2: sleeps at level 1 instead of 2" in found.message
    assert "vllm#39934" in found.message


@pytest.mark.parametrize(
    ("asked", "version", "level", "words", "there"),
    [
        (answer(422, {"detail": [{"type": "missing"}]}), "0.32.0", Level.OK, "answers", True),
        (
            answer(400, {"error": {"message": "Field required"}}),
            "0.33.0",
            Level.OK,
            "answers",
            True,
        ),
        (NOT_FOUND, "0.31.0", Level.OK, "none before vLLM 0.32.0", False),
        (NOT_FOUND, "0.33.0", Level.WARNING, "has no /weight_checker here", False),
        (answer(500, b"crash"), "0.33.0", Level.WARNING, "answered 500", False),
        (Asked(failure="no whole answer within 10s"), "0.33.0", Level.WARNING, "no answer", False),
    ],
)
def test_the_weight_checker_line(
    asked: Asked, version: str, level: Level, words: str, there: bool
) -> None:
    found = weight_checker(SUBJECT, asked, version)
    assert found.level is level and words in found.message, found
    assert checker_present(asked) is there


AWAKE = ActivitySnapshot(
    running=0,
    waiting=0,
    success_total=3,
    sleep_state=SleepState.AWAKE,
    gpu_memory_utilization=0.9,
)
PAGE = (
    "# HELP vllm:num_requests_running x\n# TYPE vllm:num_requests_running gauge\n"
    "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"
    'vllm:engine_sleep_state{sleep_state="awake"} 1\n'
    'vllm:cache_config_info{gpu_memory_utilization="0.9"} 1\n'
)
OTHER = "# HELP vllm:e2e_request_latency_seconds x\nvllm:e2e_request_latency_seconds_count 1\n"


@pytest.mark.parametrize(
    ("probe", "filtered", "whole", "version", "level", "words"),
    [
        (AWAKE, PAGE, PAGE + OTHER, "0.33.0", Level.OK, "a probe reads"),
        (AWAKE, PAGE + OTHER, PAGE + OTHER, "0.33.0", Level.WARNING, "ignores the name[] filter"),
        (
            AWAKE,
            PAGE,
            PAGE.replace("vllm:engine_sleep_state", "x"),
            "0.33.0",
            Level.WARNING,
            "no vllm:engine_sleep_state",
        ),
        (
            AWAKE,
            PAGE,
            PAGE.replace("vllm:engine_sleep_state", "x"),
            "0.10.2",
            Level.OK,
            "a probe reads",
        ),
        (
            AWAKE,
            PAGE,
            PAGE.replace("vllm:cache_config_info", "x"),
            "0.33.0",
            Level.WARNING,
            "GPU share is not known",
        ),
        (
            AWAKE,
            PAGE,
            "vllm:num_requests_running NaN-ish\n",
            "0.33.0",
            Level.FAILURE,
            "cannot be read",
        ),
        (None, PAGE, PAGE, "0.33.0", Level.FAILURE, "the operator's probe of /metrics fails"),
    ],
)
def test_the_metrics_line(
    probe: ActivitySnapshot | None,
    filtered: str,
    whole: str,
    version: str,
    level: Level,
    words: str,
) -> None:
    found = metrics(
        SUBJECT,
        probe,
        "" if probe else "no request gauges in the payload",
        answer(200, filtered.encode()),
        answer(200, whole.encode()),
        version,
    )
    assert found.level is level and words in found.message, found


def test_the_version_is_read_only_from_a_vllm_answer() -> None:
    assert version_of(answer(200, {"version": "0.33.0"})) == "0.33.0"
    assert version_of(answer(201, {"version": "0.33.0"})) is None
    assert version_of(answer(200, ["0.33.0"])) is None


def test_a_level_its_release_cannot_wake_from_is_said_with_what_snooze_does() -> None:
    found = known_bugs(SUBJECT, "0.8.0", None, pod())
    assert "sleep level 2 needs vLLM 0.10.2 or later" in found.message
    assert "level 2: sleep level 2 needs vLLM 0.10.2 or later: sleeps at level 1" in found.message
    unknown = known_bugs(SUBJECT, "0.8.0", None, None)
    assert "sleep level 2 needs vLLM 0.10.2 or later" in unknown.message
    assert unknown.level is Level.WARNING
