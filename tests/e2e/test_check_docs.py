"""docs/install.md's `snooze check` commands, run as printed through bash, and their sample output
held to what they print: the cluster's check against the sandbox holding the page's release
(the operator's pod Ready, the operator writing the example model's status, a simulated engine
in the example's pod), and the engine's check in a network namespace of the test's own, where
the port that `kubectl port-forward` would forward is a `snooze sim` on 127.0.0.1:8000 and the
pod is the sandbox's; and each page's SGLang command (docs/install.md, docs/check.md) against a
simulated SGLang server on 127.0.0.1:30000 started as the page says, in a namespace of its own.
Numbers (timings, sizes, tokens) may differ from the sample, and the API server's version and
address; nothing else."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import docs_pages
import pytest
import yaml
from check_install import ENGINE_POD, example, installed, model_running
from waits import wait_for

from .test_chart_clients import Namespace

PAGE = "docs/install.md"
CHECK_PAGE = "docs/check.md"
SGLANG_COMMAND = "snooze check --engine http://127.0.0.1:30000 --cycle"
VENV_BIN = str(Path(sys.executable).parent)
NUMBER = re.compile(r"\d+(\.\d+)?( kB| bytes)?")
SERVER = re.compile(r"Kubernetes \S+ at \S+")

__all__ = ["installed", "model_running"]


def blocks_and_samples(page: str = PAGE) -> list[tuple[str, str]]:
    """Each `snooze check` command block of the page, with the text block that follows it."""
    blocks = docs_pages.blocks(docs_pages.read(page))
    found = []
    for i, block in enumerate(blocks):
        if block.lang == "sh" and block.body.startswith("snooze check"):
            sample = blocks[i + 1]
            assert sample.lang == "text", f"no sample output after {block.body!r}"
            found.append((block.body, sample.body))
    return found


def shape(text: str) -> list[str]:
    """The lines with their numbers made alike."""
    lines = text.strip().splitlines()
    return [NUMBER.sub("N", SERVER.sub("Kubernetes V at S", line.rstrip())) for line in lines]


def test_the_page_has_its_three_commands() -> None:
    commands = [command.strip() for command, _ in blocks_and_samples()]
    assert commands == [
        "snooze check",
        f"snooze check --engine http://127.0.0.1:8000 --pod default/{ENGINE_POD} --cycle",
        SGLANG_COMMAND,
    ]
    assert [command.strip() for command, _ in blocks_and_samples(CHECK_PAGE)] == [SGLANG_COMMAND]


@pytest.mark.usefixtures("model_running")
def test_the_clusters_check_as_printed() -> None:
    [(command, sample), _, _] = blocks_and_samples()
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert shape(done.stdout) == shape(sample), done.stdout


@pytest.fixture
def namespace() -> Iterator[Namespace]:
    space = Namespace()
    yield space
    space.close()


def test_the_engines_check_as_printed(namespace: Namespace, tmp_path: Path) -> None:
    [_, (command, sample), _] = blocks_and_samples()
    snooze = (sys.executable, "-m", "snooze.cli")
    namespace.start_sandbox(tmp_path / "sandbox.log")
    # The example's pod, as its Deployment's ReplicaSet and the kubelet would make it.
    [deployment] = [d for d in example("vllm-qwen3-8b.yaml") if d["kind"] == "Deployment"]
    template = deployment["spec"]["template"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": ENGINE_POD, "namespace": "default", **template["metadata"]},
        "spec": template["spec"],
        "status": {"phase": "Running", "podIP": "10.1.0.7"},
    }
    manifest = yaml.safe_dump(pod)
    done = namespace.run(f"kubectl apply --validate=false -f - <<'EOF'\n{manifest}EOF")
    assert done.returncode == 0, done.stderr
    # What `kubectl port-forward pod/... 8000` would reach: a simulated vLLM 0.33.0 engine.
    namespace.start(*snooze, "sim", "--model", "Qwen/Qwen3-8B", log=tmp_path / "sim.log")
    wait_for(
        "the engine",
        lambda: namespace.run("curl -sf http://127.0.0.1:8000/health").returncode == 0,
    )
    namespace.env["PATH"] = f"{VENV_BIN}{os.pathsep}{namespace.env['PATH']}"
    done = namespace.run(command)
    assert done.returncode == 0, done.stdout + done.stderr
    assert shape(done.stdout) == shape(sample), done.stdout


# What each page's SGLang server runs with: install.md's as docs/sglang.md says to run it (level
# 1), check.md's without --enable-memory-saver. Its checksums are made quick; the page's numbers
# are not compared.
SGLANG_SERVERS = {
    PAGE: ("--weights-cpu-backup",),
    CHECK_PAGE: ("--weights-cpu-backup", "--no-memory-saver"),
}


@pytest.mark.parametrize("page", [PAGE, CHECK_PAGE])
def test_the_sglang_servers_check_as_printed(
    namespace: Namespace, tmp_path: Path, page: str
) -> None:
    [(command, sample)] = [(c, s) for c, s in blocks_and_samples(page) if "30000" in c]
    flags = SGLANG_SERVERS[page]
    namespace.start(
        *(sys.executable, "-m", "snooze.cli", "sim", "--engine", "sglang"),
        *("--sglang-version", "0.5.23", "--port", "30000", "--model", "Qwen/Qwen3-8B"),
        *("--checksum-seconds-per-gib", "0.05", *flags),
        log=tmp_path / "sim.log",
    )
    wait_for(
        "the server",
        lambda: namespace.run("curl -sf http://127.0.0.1:30000/v1/models").returncode == 0,
    )
    namespace.env["PATH"] = f"{VENV_BIN}{os.pathsep}{namespace.env['PATH']}"
    done = namespace.run(command)
    passed = "--no-memory-saver" not in flags
    assert done.returncode == (0 if passed else 1), done.stdout + done.stderr
    assert shape(done.stdout) == shape(sample), done.stdout
