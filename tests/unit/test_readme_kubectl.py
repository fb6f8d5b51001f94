"""Every kubectl command in the docs names Snooze's InferenceModel unambiguously: the Gateway
API Inference Extension defines a kind InferenceModel (plural inferencemodels) too."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "charts" / "snooze" / "README.md"]
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
    assert commands or doc.name != "README.md"
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
