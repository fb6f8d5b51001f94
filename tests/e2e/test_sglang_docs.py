"""docs/sglang.md's commands as a person runs them: the simulated SGLang server started exactly
as printed, and the release and resume sequence through bash and curl, with what the page says
they print."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import docs_pages
import httpx
import pytest
from waits import wait_for

pytestmark = pytest.mark.needs("curl")

PAGE = "docs/sglang.md"
ROOT = Path(__file__).resolve().parents[2]


def blocks() -> list[str]:
    """The page's last two command blocks, this test's (the walkthrough's is another's)."""
    return [b.body for b in docs_pages.command_blocks(docs_pages.read(PAGE))][-2:]


def bash(script: str, **kw: object) -> subprocess.Popen[str]:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.Popen(
        ["bash", "-c", script],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **kw,  # type: ignore[arg-type]
    )


@pytest.fixture
def server() -> Iterator[subprocess.Popen[str]]:
    serve, _ = blocks()
    process = bash(serve)
    try:

        def listening() -> bool:
            try:
                return httpx.get("http://127.0.0.1:30000/v1/models", timeout=1).is_success
            except httpx.HTTPError:
                assert process.poll() is None, process.communicate()[1]
                return False

        wait_for("the simulated server listening", listening, timeout=30)
        yield process
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.communicate(timeout=10)


def test_the_release_and_resume_sequence_prints_what_the_page_says(
    server: subprocess.Popen[str],
) -> None:
    _, sequence = blocks()
    run = bash(sequence)
    out, err = run.communicate(timeout=60)
    assert run.returncode == 0, err
    lines = [line for line in out.splitlines() if line and not line.startswith("#")]
    assert lines[0] == "0.5.23 True True"
    paused, released, held, resumed, continued = lines[1:]
    assert paused == '{"message": "Generation paused successfully.", "status": "ok"}'
    assert released == resumed == "null"
    # What the released server holds: the 1 GiB that release keeps.
    assert held.startswith("snooze_sim_gpu_memory_used_bytes{") and float(held.split()[-1]) == 2**30
    assert continued == '{"message": "Generation continued successfully.", "status": "ok"}'
