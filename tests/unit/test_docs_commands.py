"""Every command the docs print is run by a test: each command block of the README, of docs/
and of the chart's README names, in a comment just before it, the tests that run it, and each
named test exists and reads that very page. A new command without a test fails here."""

from __future__ import annotations

import re
from pathlib import Path

import docs_pages as docs
import pytest

PAGES = [p.relative_to(docs.ROOT).as_posix() for p in docs.pages()]


def reads(test: Path, page: str) -> bool:
    """Whether `test` names `page` by its path from the root, itself or through a helper module
    of tests/ that it imports (docs_pages, the generic reader, counts for no page)."""
    texts = [test.read_text()]
    for name in re.findall(r"^(?:import|from) (\w+)", texts[0], re.M):
        helper = docs.ROOT / "tests" / f"{name}.py"
        if helper.exists() and name != "docs_pages":
            texts.append(helper.read_text())
    # README.md alone is the root's README, not the chart's or the benchmarks'.
    pattern = re.escape(page) if "/" in page else rf"(?<![/\w]){re.escape(page)}"
    return any(re.search(rf"[\"']{pattern}[\"']", text) for text in texts)


@pytest.mark.parametrize("page", PAGES)
def test_every_command_block_names_a_test_that_reads_its_page(page: str) -> None:
    unclaimed, wrong = [], []
    for block in docs.command_blocks(docs.read(page)):
        if not block.claimed_by:
            unclaimed.append(block.line)
        for name in block.claimed_by:
            test = docs.ROOT / name
            if not (name.startswith("tests/") and test.is_file() and reads(test, page)):
                wrong.append(f"line {block.line}: {name}")
    assert not unclaimed, (
        f"{page}: command blocks at lines {unclaimed} name no test: run each in a test, and "
        "put `<!-- test: tests/... -->` on the line before the block"
    )
    assert not wrong, f"{page}: named tests that do not exist or do not read {page}: {wrong}"


@pytest.mark.parametrize("page", PAGES)
def test_every_claim_comment_stands_before_a_command_block(page: str) -> None:
    text = docs.read(page)
    claims = [i + 1 for i, line in enumerate(text.splitlines()) if docs.CLAIM.match(line)]
    claimed = {b.line for b in docs.command_blocks(text) if b.claimed_by}
    lines = text.splitlines()
    orphans = [
        n for n in claims if not any(
            o > n and all(not lines[k].strip() for k in range(n, o - 1)) for o in claimed
        )
    ]  # fmt: skip
    assert not orphans, f"{page}: test comments with no command block after them: {orphans}"


def test_the_check_finds_blocks_and_their_claims() -> None:
    text = (
        "Run:\n\n<!-- test: tests/unit/test_cli.py -->\n```sh\nsnooze --help\n```\n\n"
        "- in a list:\n  ```bash\n  snooze crd\n  ```\n\n```yaml\nkind: InferenceModel\n```\n"
    )
    first, second = docs.command_blocks(text)
    assert first.claimed_by == ("tests/unit/test_cli.py",) and first.body == "snooze --help\n"
    assert second.claimed_by == () and second.body == "snooze crd\n"
    assert len(docs.blocks(text)) == 3
    assert docs.commands(text) == ["snooze --help", "snooze crd"]
