"""`snooze check --engine`'s judgements of an SGLang server's answers, check by check: pure
tables of answers in, levels and words out (check/sglangjudge.py), and the cycle's level as the
operator would choose it (check/cycle.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from snooze.check.asking import Asked
from snooze.check.cycle import level_to_use
from snooze.check.report import Kind, Level, Subject
from snooze.check.sglangjudge import (
    api_keys,
    cpu_backup,
    engine,
    known_bugs,
    memory_saver,
    metrics,
    paused,
    serve_facts,
    server_said,
    wants_key,
    weight_checker,
)
from snooze.engine.activity import ActivitySnapshot
from snooze.engine.sglangfacts import SGLangFacts

URL = "http://10.0.0.7:30000"
SUBJECT = Subject(kind=Kind.ENGINE, name=URL)
INFO = {
    "version": "0.5.23",
    "model_path": "Qwen/Qwen3-8B",
    "tp_size": 1,
    "enable_memory_saver": True,
    "enable_metrics": True,
    "enable_weights_cpu_backup": True,
    "api_key": None,
    "admin_api_key": None,
}


def answer(status: int, body: Any) -> Asked:
    return Asked(status=status, body=json.dumps(body).encode())


def facts(**changes: Any) -> SGLangFacts:
    said = server_said(answer(200, {**INFO, **changes})).facts
    assert said is not None
    return said


@pytest.mark.parametrize(
    ("asked", "why"),
    [
        (answer(200, {**INFO, "version": 5}), "no version string"),
        (answer(200, {**INFO, "enable_memory_saver": "yes"}), "enable_memory_saver is not"),
        (answer(200, {**INFO, "tp_size": 0}), "tp_size"),
        (answer(200, ["0.5.23"]), "not a JSON object"),
        (Asked(status=200, body=b"<html>"), "not a JSON object"),
        (answer(500, INFO), "HTTP 500"),
        (Asked(failure="timed out"), "no answer"),
    ],
)
def test_only_a_believable_server_info_is_sglangs(asked: Asked, why: str) -> None:
    said = server_said(asked)
    assert said.facts is None and why in said.why


def test_keys_are_read_as_the_flags_set_never_their_values() -> None:
    secret = "sk-do-not-print"
    said = server_said(answer(200, {**INFO, "api_key": secret, "admin_api_key": secret}))
    assert said.keys == ("--api-key", "--admin-api-key")
    result = api_keys(SUBJECT, said.keys)
    assert result.level is Level.FAILURE
    assert secret not in result.message + result.fix + json.dumps(dict(result.data))
    assert "--api-key and --admin-api-key" in result.message
    assert api_keys(SUBJECT, server_said(answer(200, {**INFO, "api_key": ""})).keys).level is (
        Level.OK
    )


def test_the_engine_line() -> None:
    found = engine(SUBJECT, URL, facts(), "/server_info")
    assert found.level is Level.OK and found.data == {"version": "0.5.23", "kind": "sglang"}
    old = engine(SUBJECT, URL, facts(version="0.4.8"), "/get_server_info")
    assert old.level is Level.FAILURE and "0.4.9 or later" in old.message


def test_memory_saver_and_the_level_the_flags_make() -> None:
    assert memory_saver(SUBJECT, facts()).level is Level.OK
    off = memory_saver(SUBJECT, facts(enable_memory_saver=False))
    assert off.level is Level.FAILURE and "never puts it to sleep" in off.message
    assert cpu_backup(SUBJECT, facts()).data == {"level": 1}
    dropped = cpu_backup(SUBJECT, facts(enable_weights_cpu_backup=False))
    assert dropped.data == {"level": 2} and "'Qwen/Qwen3-8B'" in dropped.message
    older = cpu_backup(SUBJECT, facts(version="0.5.2", enable_weights_cpu_backup=False))
    assert "has no --enable-weights-cpu-backup (0.5.3+)" in older.message


@pytest.mark.parametrize(
    ("version", "tp", "level", "bugs"),
    [
        ("0.5.23", 1, Level.OK, []),
        ("0.5.5", 1, Level.WARNING, ["sglang-abort-pause-then-assert"]),
        ("0.5.23", 4, Level.WARNING, ["sglang-tp-release-answers-early"]),
    ],
)
def test_the_known_bugs_line(version: str, tp: int, level: Level, bugs: list[str]) -> None:
    found = known_bugs(SUBJECT, facts(version=version, tp_size=tp))
    assert found.level is level
    assert found.data.get("bugs", []) == bugs
    if bugs:
        assert "Snooze (wake.onKnownBug FallBack)" in found.message


@pytest.mark.parametrize(
    ("version", "words"),
    [
        ("0.5.12", "has /weights_checker's checksum"),
        ("0.5.6", "without its checksum action"),
        ("0.5.5", "has no /weights_checker"),
    ],
)
def test_the_weight_checker_line_is_the_releases(version: str, words: str) -> None:
    found = weight_checker(SUBJECT, facts(version=version))
    assert found.level is Level.OK and words in found.message


def test_the_metrics_line() -> None:
    probe = ActivitySnapshot(running=2, waiting=1, success_total=5.0, sleep_state=None)
    page = "# HELP sglang:num_running_reqs x\n# TYPE sglang:num_running_reqs gauge\n"
    filtered = Asked(status=200, body=page.encode())
    whole = Asked(status=200, body=(page * 10).encode())
    found = metrics(SUBJECT, facts(), probe, "", filtered, whole)
    assert found.level is Level.OK and "2 running" in found.message and "1 queued" in found.message
    assert found.data == {"probe_bytes": len(filtered.body), "page_bytes": len(whole.body)}
    ignoring = Asked(status=200, body=(page + "# HELP python_info x\n").encode())
    assert metrics(SUBJECT, facts(), probe, "", ignoring, whole).level is Level.WARNING
    missing = Asked(status=404, body=b'{"detail":"Not Found"}')
    failed = metrics(SUBJECT, facts(enable_metrics=False), None, "404", missing, missing)
    assert failed.level is Level.FAILURE and "--enable-metrics" in failed.fix


def test_what_says_a_server_may_be_released_already() -> None:
    assert paused(None, released=False) is None
    assert paused(Asked(status=200), released=False) is None
    assert "/ready answers 503" in (paused(Asked(status=503), released=False) or "")
    assert "snooze.dev/released" in (paused(None, released=True) or "")


@pytest.mark.parametrize(
    ("backup", "asked", "level", "moved"),
    [
        (True, None, 1, False),
        (False, None, 2, False),
        (True, 1, 1, False),
        (False, 2, 2, False),
        (False, 1, 2, True),
        (True, 2, 1, True),
    ],
)
def test_the_cycle_sleeps_at_the_level_the_flags_make(
    backup: bool, asked: int | None, level: int, moved: bool
) -> None:
    found, why = level_to_use(SUBJECT, serve_facts(facts(enable_weights_cpu_backup=backup)), asked)
    assert found == level
    assert bool(why) is moved
    if moved:
        assert "an SGLang server sleeps at the level its flags make" in why


@pytest.mark.parametrize(
    ("asked", "sglangs"),
    [
        (answer(401, {"error": "Unauthorized"}), True),
        (answer(403, {"error": "Forbidden"}), True),
        (answer(401, {"error": "Forbidden"}), False),
        (answer(401, {"error": "Unauthorized", "login": "/sso"}), False),
        (answer(401, {"detail": "Not authenticated"}), False),
        (Asked(status=401, body=b"<h1>401 Authorization Required</h1>"), False),
        (answer(200, {"error": "Unauthorized"}), False),
    ],
)
def test_only_sglangs_own_refusal_says_it_wants_a_key(asked: Asked, sglangs: bool) -> None:
    assert wants_key(asked) is sglangs
