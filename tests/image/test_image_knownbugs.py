"""The image's check command knows the same sleep and wake bugs as the operator: the same rows,
read from the same `vllm serve` arguments, told for the installed release."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path
from typing import Any

import pytest

from snooze.kube.serveargs import serve_args
from snooze.policy.knownbugs import TABLE
from snooze_vllm_patch.knownbugs import ROWS, parse_serve_args

from .test_image_plugin import PLUGIN_SRC

pytestmark = pytest.mark.vllm_wheels


def test_the_rows_are_the_operators_own() -> None:
    fields = [f.name for f in dataclasses.fields(ROWS[0])]
    assert [[getattr(row, f) for f in fields] for row in ROWS] == [
        [getattr(bug, f) for f in fields] for bug in TABLE
    ]


@pytest.mark.parametrize(
    "line",
    [
        "serve m",
        "serve m --enable-lora -tp 2",
        "serve m --enable_lora=false --tensor_parallel_size=4 -pp 2",
        "serve m --lora-modules a=/a --pipeline-parallel-size 3",
        "serve m --enable-lora --no-enable-lora",
    ],
)
def test_the_arguments_are_read_as_the_operator_reads_them(line: str) -> None:
    theirs = dataclasses.asdict(serve_args({"containers": [{"args": line.split()}]}))
    ours = dataclasses.asdict(parse_serve_args(line))
    # The operator reads more of the arguments (sleep mode, a --config file) for other ends:
    # what the known-bug rows read is read alike.
    assert ours == {key: theirs[key] for key in ours}


def check(python: Any, vllm: Path, entry_points: Path, *argv: str) -> Any:
    script = (
        f"import sys\nfrom snooze_vllm_patch.check import main\nsys.exit(main({list(argv)!r}))\n"
    )
    return python(script, path=[vllm, entry_points, PLUGIN_SRC])


def test_a_known_bug_at_the_sleep_level_fails_the_check_and_says_what_to_do(
    python: Any, fake_vllm: Any, plugin_entry_points: Path
) -> None:
    done = check(
        python,
        fake_vllm("0.27.1", None),
        plugin_entry_points,
        "--serve-args",
        "serve org/m --enable-lora --tensor-parallel-size 2",
        "--sleep-level",
        "1",
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.startswith("fixed: vLLM 0.27.1")  # the hybrid fix is fine here
    lines = [line for line in done.stderr.splitlines() if "[snooze_vllm_patch]" not in line]
    assert lines[0].startswith("known bug: lora-tp-level1: ") and "vllm#53888" in lines[0]
    assert lines[1].startswith("known bug: lora-level2: ")
    assert lines[-1] == "sleep level 1 breaks here: do not put this engine to sleep"


def test_a_safe_level_passes_and_a_drain_rule_is_only_said(
    python: Any, fake_vllm: Any, plugin_entry_points: Path
) -> None:
    lora = check(
        python, fake_vllm("0.28.0", None), plugin_entry_points,
        "--serve-args", "serve m --enable-lora -tp 2", "--sleep-level", "2",
    )  # fmt: skip
    assert lora.returncode == 0, lora.stderr
    assert "known bug: lora-tp-level1" in lora.stdout and "breaks" not in lora.stdout
    racy = check(
        python, fake_vllm("0.24.0", "0.24.0"), plugin_entry_points, "--serve-args", "serve m -tp 4"
    )
    assert racy.returncode == 0, racy.stderr
    assert racy.stdout.splitlines()[-1] == "never send /sleep with requests in flight: drain first"


def test_without_arguments_the_check_is_what_it_was(
    python: Any, fake_vllm: Any, plugin_entry_points: Path
) -> None:
    done = check(python, fake_vllm("0.26.0"), plugin_entry_points)
    assert done.returncode == 0 and done.stdout.count("\n") == 1, done.stdout


def test_the_readme_command_runs_as_printed(
    python: Any, fake_vllm: Any, plugin_entry_points: Path
) -> None:
    readme = (PLUGIN_SRC.parents[1] / "README.md").read_text()
    commands = readme.splitlines()
    [line] = [c for c in commands if c.startswith("python3 -m snooze_vllm_patch check --")]
    argv = shlex.split(line)[3:]  # what follows `python3 -m snooze_vllm_patch`
    script = (
        "import runpy, sys\n"
        f"sys.argv = ['snooze_vllm_patch', *{argv!r}]\n"
        "runpy.run_module('snooze_vllm_patch', run_name='__main__')\n"
    )
    done = python(script, path=[fake_vllm("0.28.0", None), plugin_entry_points, PLUGIN_SRC])
    assert done.returncode == 1
    assert "sleep level 1 breaks here: use sleep level 2" in done.stderr
