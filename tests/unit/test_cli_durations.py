"""Every flag of every `snooze` subcommand that takes a time takes it as the specs write
durations (`10s`, `500ms`, `1m30s`) as well as a plain number of seconds, and refuses a bad
one with a line naming the flag."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

import pytest

from snooze.cli import build_parser

# A flag whose name says it takes a time.
TIME_FLAG = re.compile(r"--([a-z0-9-]+-)?(seconds|timeout|interval|lifetime|duration)$")


def subcommands() -> dict[str, argparse.ArgumentParser]:
    [choices] = [
        action.choices
        for action in build_parser()._actions
        if isinstance(action, argparse._SubParsersAction)
    ]
    return dict(choices)


def time_flags() -> list[tuple[str, str, argparse.Action]]:
    found = []
    for command, parser in subcommands().items():
        for action in parser._actions:
            for flag in action.option_strings:
                if TIME_FLAG.fullmatch(flag):
                    found.append((command, flag, action))
    return found


FLAGS = time_flags()


def test_the_commands_have_time_flags() -> None:
    """The check below looks at something: the flags of every long-running part."""
    commands = {command for command, _, _ in FLAGS}
    assert {"operator", "gateway", "sim", "whatif", "demo"} <= commands
    assert ("operator", "--probe-interval") in {(c, f) for c, f, _ in FLAGS}


@pytest.mark.parametrize(
    ("command", "flag", "action"), FLAGS, ids=[f"{c} {f}" for c, f, _ in FLAGS]
)
def test_a_time_flag_takes_a_duration(command: str, flag: str, action: argparse.Action) -> None:
    parse = action.type
    assert callable(parse) and getattr(parse, "__name__", "") == "duration", (
        f"snooze {command} {flag} does not use snooze.api.durations.duration_flag"
    )
    assert parse("1m30s") == parse("90") == 90
    assert parse("500ms") == 0.5 == parse(str(0.5))
    assert parse(str(5e-05)) == 5e-05  # a small float as Python prints it
    with pytest.raises(argparse.ArgumentTypeError, match="is not a duration"):
        parse("ten seconds")
    # The default is a number of seconds, as the flag's value is.
    assert isinstance(action.default, int | float) and action.default >= 0


@pytest.mark.parametrize("command", ["operator", "gateway", "sim", "whatif", "demo"])
def test_a_bad_duration_is_one_line_naming_the_flag(command: str) -> None:
    flag = next(f for c, f, _ in FLAGS if c == command)
    done = subprocess.run(
        [sys.executable, "-m", "snooze.cli", command, flag, "10x"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1] == (
        f"snooze {command}: error: argument {flag}: '10x' is not a duration: write seconds "
        "(10, 2.5) or a number and a unit (ms, s, m, h), such as 10s, 500ms or 1m30s"
    )
