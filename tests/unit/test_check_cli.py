"""`snooze check`'s flags: those that do not go together are refused in one line naming the flag,
with exit status 2, before anything is asked of an engine or a cluster; and the cycle's own
decisions (whether it may run, at which level), which are pure."""

from __future__ import annotations

import subprocess
import sys

import pytest

from snooze.check.cycle import Before, CycleOptions, first_model, level_to_use, refusal
from snooze.check.report import Kind, Level, Subject
from snooze.cli import main
from snooze.engine.activity import ActivitySnapshot, SleepState
from snooze.policy.knownbugs import ServeFacts

CHECK = [sys.executable, "-m", "snooze.cli", "check"]


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["--engine", "127.0.0.1:8000"], "--engine '127.0.0.1:8000' is not an http(s) URL"),
        (["--engine", "ftp://h/"], "is not an http(s) URL"),
        (["--pod", "default/p"], "1 --pod for 0 --engine"),
        (["--engine", "http://h:1", "--pod", "p"], "--pod 'p' is not NAMESPACE/NAME"),
        (["--engine", "http://h:1", "--pod", "a/b/c"], "is not NAMESPACE/NAME"),
        (["--cycle"], "--cycle needs --engine URL"),
        (["--force"], "--force needs --engine URL"),
        (["--engine", "http://h:1", "--force"], "--force goes with --cycle"),
        (["--engine", "http://h:1", "--level", "2"], "--level goes with --cycle"),
        (["--engine", "http://h:1", "--model", "m"], "--model goes with --cycle"),
        (["--engine", "http://h:1", "--namespace", "llm"], "--namespace is for the cluster"),
        (["--operator", "snooze"], "--operator 'snooze' is not NAMESPACE/NAME"),
    ],
)
def test_flags_that_do_not_go_together_are_one_line_and_exit_2(
    args: list[str], complaint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", *args]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("snooze check: ") and err.count("\n") == 1
    assert complaint in err


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["--level", "3"], "argument --level: invalid choice: 3 (choose from 1, 2)"),
        (["--timeout", "soon"], "argument --timeout: 'soon' is not a duration"),
        (["--output", "yaml"], "argument --output: invalid choice: 'yaml'"),
    ],
)
def test_bad_values_are_refused_by_argparse_naming_the_flag(
    args: list[str], complaint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as refused:
        main(["check", *args])
    assert refused.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith(f"snooze check: error: {complaint}")


def test_no_credentials_is_one_line_and_exit_2(tmp_path: object) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run(CHECK, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 2
    assert done.stderr.startswith("snooze check: no Kubernetes credentials found")
    assert done.stderr.count("\n") == 1


SUBJECT = Subject(kind=Kind.ENGINE, name="http://e:8000")


def snapshot(running: int = 0, waiting: int = 0) -> ActivitySnapshot:
    return ActivitySnapshot(
        running=running, waiting=waiting, success_total=0, sleep_state=SleepState.AWAKE
    )


@pytest.mark.parametrize(
    ("before", "force", "words"),
    [
        (Before(sleeping=False, activity=snapshot(), facts=ServeFacts()), False, None),
        (Before(sleeping=False, activity=None, facts=ServeFacts()), False, None),
        (Before(sleeping=True, activity=snapshot(), facts=ServeFacts()), True, "asleep already"),
        (
            Before(sleeping=False, activity=snapshot(1, 2), facts=ServeFacts()),
            False,
            "serving 3 request(s)",
        ),
        (Before(sleeping=False, activity=snapshot(1, 2), facts=ServeFacts()), True, None),
    ],
)
def test_the_cycle_refuses_an_engine_that_serves_unless_forced(
    before: Before, force: bool, words: str | None
) -> None:
    found = refusal(SUBJECT, before, CycleOptions(force=force))
    if words is None:
        assert found is None
    else:
        assert found is not None and found.level is Level.FAILURE and words in found.message


@pytest.mark.parametrize(
    ("facts", "asked", "level", "words"),
    [
        (ServeFacts(version="0.33.0"), 1, 1, ""),
        (ServeFacts(version="0.33.0"), 2, 2, ""),
        # LoRA before 0.28: level 2 breaks, the operator sleeps it at level 1 instead.
        (ServeFacts(version="0.27.1", lora=True), 2, 1, "not at level 2 as asked: Snooze sleeps"),
        # LoRA at tensor parallel 2 before 0.28: no level is safe, the operator keeps it awake.
        (ServeFacts(version="0.27.1", lora=True, tensor_parallel=2), 1, None, "stays awake"),
    ],
)
def test_the_cycle_sleeps_at_the_level_the_operator_would(
    facts: ServeFacts, asked: int, level: int | None, words: str
) -> None:
    found, why = level_to_use(SUBJECT, facts, asked)
    assert found == level
    assert (why == "") == (words == "") and words in why


@pytest.mark.parametrize(
    ("body", "model"),
    [
        (
            b'{"object": "list", "data": [{"id": "Qwen/Qwen3-8B"}, {"id": "lora-a"}]}',
            "Qwen/Qwen3-8B",
        ),
        (b'{"data": []}', None),
        (b'{"data": [{"id": 7}]}', None),
        (b"not json", None),
        (b'[{"id": "m"}]', None),
    ],
)
def test_the_first_model_of_v1_models(body: bytes, model: str | None) -> None:
    assert first_model(body) == model
