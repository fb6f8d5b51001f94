"""Every kubectl command in the docs, in the CLI's help, in the chart's notes and alerts, and in
the messages the code writes names Snooze's InferenceModel unambiguously: the Gateway API
Inference Extension defines a kind InferenceModel (plural inferencemodels) too."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").rglob("*.md")),
    ROOT / "charts" / "snooze" / "README.md",
    ROOT / "benchmarks" / "README.md",
    ROOT / "benchmarks" / "HISTORY.md",
    ROOT / "images" / "vllm" / "README.md",
]
# A resource argument that names InferenceModels without their group.
AMBIGUOUS = re.compile(r"(^|[\s,/])inferencemodels?(?!\.snooze\.dev)(?=$|[\s,/.])", re.IGNORECASE)


def kubectl_commands(text: str) -> list[str]:
    """kubectl commands in code blocks (whole lines) and in inline code."""
    found = [m.group(0) for m in re.finditer(r"`(kubectl [^`]+)`", text)]
    in_block = False
    for line in text.splitlines():
        if line.startswith("```"):
            in_block = not in_block
        elif in_block and re.search(r"(^|\s)kubectl\s", line):
            found.append(line[line.index("kubectl") :])
    return found


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_kubectl_names_our_inferencemodels_unambiguously(doc: Path) -> None:
    commands = kubectl_commands(doc.read_text())
    assert commands or doc != DOCS[0]  # the check finds what the main README runs
    ambiguous = [c for c in commands if AMBIGUOUS.search(c.split("#")[0])]
    assert ambiguous == [], "use `im` or `inferencemodels.snooze.dev`"


def test_the_check_catches_what_it_should() -> None:
    for bad in ("kubectl get inferencemodels", "kubectl explain inferencemodel.spec.wake"):
        assert AMBIGUOUS.search(bad), bad
    for good in (
        "kubectl get im",
        "kubectl get inferencemodels.snooze.dev -A",
        "kubectl get im,pods",
    ):
        assert not AMBIGUOUS.search(good), good


def kubectl_in_text(text: str) -> list[str]:
    """kubectl commands anywhere in a text: up to a quote, a backquote or the line's end."""
    return [m.group(0) for m in re.finditer(r"kubectl [^`\"'\n]+", text)]


@pytest.mark.parametrize("command", ["sandbox", "demo", "operator", "gateway", "sim", "crd"])
def test_the_help_names_our_inferencemodels_unambiguously(command: str) -> None:
    help_text = subprocess.run(
        [sys.executable, "-m", "snooze.cli", command, "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert [c for c in kubectl_in_text(help_text) if AMBIGUOUS.search(c)] == []


SOURCES = [
    *sorted((ROOT / "operator" / "snooze").rglob("*.py")),
    *sorted((ROOT / "charts" / "snooze" / "templates").iterdir()),
    ROOT / "charts" / "snooze" / "rules" / "snooze.rules.yaml",
]


def test_messages_and_chart_texts_name_our_inferencemodels_unambiguously() -> None:
    commands = {
        path.relative_to(ROOT).as_posix(): kubectl_in_text(path.read_text()) for path in SOURCES
    }
    assert commands["charts/snooze/templates/NOTES.txt"]
    ambiguous = {p: [c for c in found if AMBIGUOUS.search(c)] for p, found in commands.items()}
    assert {p: found for p, found in ambiguous.items() if found} == {}, (
        "use `im` or `inferencemodels.snooze.dev`"
    )
