"""Docker's .dockerignore rules as tests/buildcontext.py applies them to the operator image's
build context: the last matching pattern decides, for a path or any of its folders."""

from __future__ import annotations

import buildcontext
import pytest

RULES = ["*", "!pyproject.toml", "!operator/snooze/", "operator/snooze/**/__pycache__",
         "operator/snooze/**/*.pyc", "operator/snooze/demo/"]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "left_out"),
    [
        ("pyproject.toml", False),
        ("charts/snooze/values.yaml", True),
        ("tests/run", True),
        ("operator/snooze/cli.py", False),
        ("operator/snooze/sim/server.py", False),
        ("operator/snooze/api/__pycache__/crd.cpython-311.pyc", True),
        ("operator/snooze/api/crd.pyc", True),
        ("operator/snooze/__pycache__/cli.cpython-311.pyc", True),
        ("operator/snooze/cli.pyc", True),
        ("operator/snooze/demo/cli.py", True),
        ("operator/snooze/demonstration.py", False),
        ("operator/other.py", True),
    ],
)
def test_the_last_matching_rule_decides(path: str, left_out: bool) -> None:
    assert buildcontext.ignored(path, RULES) is left_out


def test_the_images_context_leaves_out_the_tools() -> None:
    rules = buildcontext.rules()
    assert buildcontext.ignored("operator/snooze/sandbox/emulator.py", rules)
    assert buildcontext.ignored("operator/snooze/demo/run.py", rules)
    assert not buildcontext.ignored("operator/snooze/sim/cli.py", rules)
    assert not buildcontext.ignored("pyproject.toml", rules)


def test_the_image_builds_from_what_its_dockerfile_copies() -> None:
    sources = buildcontext.copied_sources()
    assert buildcontext.copied("operator/snooze/cli.py", sources)
    assert buildcontext.copied("README.md", sources)
    assert buildcontext.copied("LICENSE", sources)
    assert not buildcontext.copied("charts/snooze/values.yaml", sources)
    assert not buildcontext.ignored("LICENSE", buildcontext.rules())
