"""`snooze gateway`'s flags: each sets its setting, refuses what is not a positive finite
number, and is documented in the command line reference (docs/reference/cli.md)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from snooze.gateway.cli import add_arguments, settings_from
from snooze.gateway.settings import GatewaySettings

DOCS = Path(__file__).resolve().parents[2] / "docs"
REFERENCE = DOCS / "reference" / "cli.md"
PAGE = DOCS / "gateway.md"


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def flags() -> list[str]:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    options = (o for a in parser._actions for o in a.option_strings)
    return [o for o in options if o.startswith("--") and o != "--help"]


def test_defaults_are_the_settings_defaults() -> None:
    settings = settings_from(parse())
    expected = dataclasses.replace(GatewaySettings(), namespaces=())
    assert settings == expected
    assert settings.expose_model_status is False


def test_each_flag_sets_its_setting() -> None:
    settings = settings_from(
        parse(
            "--upstream-first-byte-timeout", "7", "--upstream-idle-timeout", "3",
            "--client-header-timeout", "2", "--client-body-timeout", "9",
            "--max-buffered-body-bytes", "1000", "--wake-request-timeout", "4",
            "--shutdown-grace-seconds", "12", "--expose-model-status", "--namespace", "a",
        )
    )  # fmt: skip
    assert (
        settings.upstream_first_byte_timeout,
        settings.upstream_idle_timeout,
        settings.client_header_timeout,
        settings.client_body_timeout,
        settings.max_buffered_body_bytes,
        settings.wake_request_timeout,
        settings.shutdown_grace_seconds,
        settings.expose_model_status,
        settings.namespaces,
    ) == (7.0, 3.0, 2.0, 9.0, 1000, 4.0, 12.0, True, ("a",))


@pytest.mark.parametrize("value", ["0", "-1"])
def test_a_count_must_be_positive(value: str) -> None:
    with pytest.raises(SystemExit, match="--max-held-per-model must be a finite number"):
        settings_from(parse("--max-held-per-model", value))


def test_timeouts_are_durations_as_the_specs_write_them() -> None:
    settings = settings_from(
        parse(
            "--upstream-first-byte-timeout", "10m", "--upstream-idle-timeout", "1m30s",
            "--connect-timeout", "500ms", "--keepalive-seconds", "2", "--shutdown-grace-seconds",
            "1m",
        )
    )  # fmt: skip
    assert (
        settings.upstream_first_byte_timeout,
        settings.upstream_idle_timeout,
        settings.connect_timeout,
        settings.keepalive_seconds,
        settings.shutdown_grace_seconds,
    ) == (600, 90, 0.5, 2, 60)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("0", "'0': give a duration greater than zero"),
        ("-1", "'-1' is negative"),
        ("nan", "'nan' is not a duration: write seconds (10, 2.5) or a number and a unit"),
        ("inf", "'inf' is not a duration"),
        ("1e400", "'1e400' is longer than the longest duration Kubernetes can represent"),
        ("10 s", "'10 s' is not a duration"),
    ],
)
def test_a_bad_duration_is_refused_naming_the_flag(value: str, says: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "snooze.cli", "gateway", "--upstream-idle-timeout", value],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    [line] = [line for line in done.stderr.splitlines() if "error:" in line]
    assert line.startswith(f"snooze gateway: error: argument --upstream-idle-timeout: {says}")


def test_the_docs_document_every_flag() -> None:
    """The command line reference lists every flag (it is generated from this parser), and the
    gateway's page sends its reader there."""
    text = REFERENCE.read_text()
    section = text[text.index("## `snooze gateway`") :]
    section = section[: section.index("\n## ", 3)]
    missing = [f for f in flags() if not re.search(re.escape(f) + r"\b", section)]
    assert not missing, f"docs/reference/cli.md's gateway section does not document {missing}"
    assert "(reference/cli.md#snooze-gateway)" in PAGE.read_text()


def test_no_credentials_is_a_clear_error_not_a_traceback(tmp_path: Path) -> None:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "KUBECONFIG": str(tmp_path / "missing"),
    }
    done = subprocess.run(
        [sys.executable, "-m", "snooze.cli", "gateway", "--port", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    # One line that names the file and says what to do; exit 2, as for any unusable kubeconfig.
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("snooze gateway: ")
    assert str(tmp_path / "missing") in done.stderr and "--kubeconfig" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
