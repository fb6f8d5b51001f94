"""The operator image's build context as Docker sends it: the repository's files that
images/operator/Dockerfile.dockerignore keeps, so that tests run what the image holds."""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "images" / "operator" / "Dockerfile"
DOCKERIGNORE = ROOT / "images" / "operator" / "Dockerfile.dockerignore"


def rules() -> list[str]:
    return [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]


def ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule for a path of the build context: the last pattern that matches it or one
    of its parent folders decides; `*` stays within a folder, `**` crosses them, `!` keeps."""
    parts = path.split("/")
    verdict = False
    for rule in patterns:
        keep = rule.startswith("!")
        pattern = rule.removeprefix("!").strip("/")
        # `**/` stands for no folder or any number of them.
        regex = "".join(
            {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*"}.get(token) or re.escape(token)
            for token in re.split(r"(\*\*/|\*\*|\*)", pattern)
        )
        if any(re.fullmatch(regex, "/".join(parts[:n])) for n in range(1, len(parts) + 1)):
            verdict = not keep
    return verdict


def tracked() -> list[str]:
    """The repository's files as a clone has them (tracked, and new ones not ignored)."""
    return subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip


def copy(to: Path, names: list[str]) -> Path:
    for name in names:
        if (ROOT / name).is_file():
            (to / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, to / name)
    return to


def copied_sources() -> list[str]:
    """The sources of the Dockerfile's COPY lines that take from the build context (its
    build stage copies each to the same path under its WORKDIR)."""
    sources = []
    for line in DOCKERFILE.read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(w.startswith("--from") for w in words):
            sources += [w for w in words[1:-1] if not w.startswith("--")]
    return sources


def copied(name: str, sources: list[str]) -> bool:
    return any(
        fnmatch.fnmatchcase(name, source) or name.startswith(source.rstrip("/") + "/")
        for source in sources
    )


def image_context(to: Path) -> Path:
    """The files the image's `pip install .` builds from, copied to TO: those that `docker
    build -f images/operator/Dockerfile .` sends and its COPY lines take."""
    patterns, sources = rules(), copied_sources()
    return copy(
        to,
        [name for name in tracked() if not ignored(name, patterns) and copied(name, sources)],
    )
