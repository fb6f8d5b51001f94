"""Every flag of `snooze operator` reaches the operator's settings, and a wrong one is refused
with a line naming it."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from snooze.operator.cli import add_arguments, settings_from
from snooze.operator.settings import Settings


def parsed(*argv: str) -> Settings:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return settings_from(parser.parse_args(list(argv)))


def test_every_flag_reaches_the_settings() -> None:
    settings = parsed(
        "--probe-interval", "3", "--drain-timeout", "7", "--drift-interval", "90",
        "--status-interval", "30", "--peering-lifetime", "20",
        "--gateway-service", "snooze/snooze-gateway-metrics",
        "--gateway-metrics", "http://10.0.0.7:9091/metrics",
        "--gateway-metrics", "https://[fd00::7]:9091/metrics",
        "--write-budget", "0.5",
    )  # fmt: skip
    assert settings.probe_interval == 3
    assert settings.write_budget == 0.5
    assert settings.drain_timeout == 7
    assert settings.drift_interval == 90
    assert settings.status_interval == 30
    assert settings.peering_lifetime == 20
    assert settings.gateway_service == "snooze/snooze-gateway-metrics"
    assert settings.gateway_metrics == (
        "http://10.0.0.7:9091/metrics",
        "https://[fd00::7]:9091/metrics",
    )


def test_durations_are_taken_as_the_specs_write_them() -> None:
    """As every spec's durations: `10s`, `1m30s`, `500ms`; a plain number is seconds."""
    settings = parsed(
        "--probe-interval", "10s", "--drain-timeout", "1m30s", "--drift-interval", "2m",
        "--status-interval", "1h", "--peering-lifetime", "90s",
    )  # fmt: skip
    assert (
        settings.probe_interval,
        settings.drain_timeout,
        settings.drift_interval,
        settings.status_interval,
    ) == (10, 90, 120, 3600)
    assert parsed("--probe-interval", "0.5").probe_interval == 0.5
    # kopf counts a peer's lifetime in whole seconds: never shorter than asked.
    assert parsed("--peering-lifetime", "2500ms").peering_lifetime == 3


def test_the_defaults_read_no_gateway() -> None:
    settings = parsed()
    assert settings.gateway_service is None and settings.gateway_metrics == ()


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--gateway-service", "snooze-gateway-metrics"], "--gateway-service is NAMESPACE/NAME"),
        (["--gateway-metrics", "10.0.0.7:9091/metrics"], "--gateway-metrics '10.0.0.7:9091"),
        (["--gateway-metrics", "ftp://gw/metrics"], "is not an http(s) URL"),
        (["--drift-interval", "0"], "argument --drift-interval: '0': give a duration greater"),
        (["--status-interval", "-1"], "argument --status-interval: '-1' is negative"),
        (["--probe-interval", "1e400"], "argument --probe-interval: '1e400' is longer than"),
        (["--probe-interval", "inf"], "argument --probe-interval: 'inf' is not a duration"),
        (["--probe-interval", "10x"], "write seconds (10, 2.5) or a number and a unit"),
        (["--drain-timeout", "nan"], "argument --drain-timeout: 'nan' is not a duration"),
        (["--drain-timeout", "300000y"], "argument --drain-timeout: '300000y' is not a dur"),
        (["--peering-lifetime", "1s"], "--peering-lifetime must be at least 2 seconds"),
        (["--write-budget", "-1"], "--write-budget -1 is not a budget"),
        (["--write-budget", "nan"], "--write-budget nan is not a budget"),
        (["--write-budget", "inf"], "--write-budget inf is not a budget"),
    ],
)
def test_a_wrong_flag_is_refused_by_name(argv: list[str], named: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "snooze.cli", "operator", *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert named in result.stderr, result.stderr
