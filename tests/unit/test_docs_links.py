"""No link of the docs dangles: the pages outside the docs site (the README, the chart's,
the benchmarks', the patched image's) link files and headings that exist, no shipped file names
a placeholder address (there is no published one), and no file of the repository names a Markdown
file that is not there (as the code once cited notes on vLLM that the repository did not
hold). The site's own links are checked by `mkdocs build --strict` (tests/run)."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OUTSIDE_THE_SITE = [
    "README.md",
    "CONTRIBUTING.md",
    "charts/snooze/README.md",
    "benchmarks/README.md",
    "benchmarks/HISTORY.md",
    "images/vllm/README.md",
    "traces/SERVEGEN.md",
]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(markdown: str) -> set[str]:
    """Each heading's fragment as GitHub makes it: lowercase, punctuation but hyphens and
    underscores dropped, each space a hyphen."""
    headings = re.findall(r"^#+ (.+?)\s*$", markdown, re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def broken(target: Path, fragment: str) -> bool:
    if not target.exists():
        return True
    return bool(fragment) and target.suffix == ".md" and fragment not in anchors(target.read_text())


@pytest.mark.parametrize("page", OUTSIDE_THE_SITE)
def test_links_of_pages_outside_the_site_resolve(page: str) -> None:
    path = ROOT / page
    bad = []
    for link in LINK.findall(path.read_text()):
        if re.match(r"[a-z]+:", link):
            continue
        file, _, fragment = link.partition("#")
        target = (path.parent / file) if file else path
        if broken(target, fragment):
            bad.append(link)
    assert not bad, f"{page} links to what is not there: {bad}"


PLACEHOLDER = re.compile(
    r"(?<![\w-])(?:[\w-]+\.)*example\.(?:com|org|net)\b|\b(?:github\.com|ghcr\.io)/example\b", re.I
)
"""Hosts that serve nobody's Snooze: no repository, image or docs address is published, so a
shipped file names none (a reader who follows one finds nothing, or someone else's)."""


def shipped() -> list[Path]:
    """Every file of the repository but the tests' own (whose example.com names are data)."""
    return [p for p in tracked() if p.relative_to(ROOT).parts[0] != "tests"]


def texts(paths: list[Path]) -> Iterator[tuple[Path, str]]:
    """Each path with its text; files that are not UTF-8 text are left out."""
    for path in paths:
        try:
            yield path, path.read_text()
        except UnicodeDecodeError:
            continue


def test_no_shipped_file_names_a_placeholder_address() -> None:
    found = []
    for path, text in texts(shipped()):
        for number, line in enumerate(text.splitlines(), 1):
            found += [f"{path.relative_to(ROOT)}:{number}: {m}" for m in PLACEHOLDER.findall(line)]
    assert not found, f"placeholder addresses in shipped files: {found}"


def tracked() -> list[Path]:
    names = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    return [ROOT / n for n in names if (ROOT / n).is_file() and Path(n).suffix in TEXT]


TEXT = {".py", ".md", ".yaml", ".yml", ".json", ".txt", ".tpl", ".toml", ".cfg", ""}
MENTION = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w-]+\.md)\b")


def test_no_file_names_a_markdown_file_that_is_not_there() -> None:
    existing = {
        p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*.md") if ".cache" not in p.parts
    }
    names = {Path(p).name for p in existing}
    dangling = []
    for path, text in texts(tracked()):
        for mention in set(MENTION.findall(text)):
            # From the root, from the file's folder, or from the docs' (the site's own paths,
            # in mkdocs.yml and in the pages the reference script writes).
            bases = (ROOT, path.parent, ROOT / "docs", ROOT / "docs" / "reference")
            resolved = {(base / mention).resolve() for base in bases}
            known = any(
                r.is_relative_to(ROOT) and r.relative_to(ROOT).as_posix() in existing
                for r in resolved
            ) or ("/" not in mention and mention in names)
            if not known:
                dangling.append(f"{path.relative_to(ROOT)}: {mention}")
    assert not dangling, f"Markdown files named but not in the repository: {sorted(dangling)}"
