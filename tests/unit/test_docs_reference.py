"""The reference pages of the docs are generated from their sources of truth (the CRDs, the
`snooze` command's parsers, the metrics registries) by scripts/docs_reference.py; a checked-in
page that differs from what the script writes now is stale."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "docs_reference", ROOT / "scripts" / "docs_reference.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["docs_reference"] = module
    spec.loader.exec_module(module)
    return module


REFERENCE = generator()


@pytest.mark.parametrize("name", sorted(REFERENCE.PAGES))
def test_the_checked_in_page_is_the_generated_one(name: str) -> None:
    assert (ROOT / "docs" / "reference" / name).read_text() == REFERENCE.PAGES[name](), (
        f"docs/reference/{name} is stale: run `python scripts/docs_reference.py`"
    )


@pytest.mark.parametrize("name", sorted(REFERENCE.README_PAGES))
def test_the_sites_page_of_a_readme_section_is_that_section(name: str) -> None:
    """The comparison, the limits and the maturity are written once, in the README; the site's
    pages are generated from it."""
    assert (ROOT / "docs" / name).read_text() == REFERENCE.readme_page(name), (
        f"docs/{name} is stale: run `python scripts/docs_reference.py`"
    )
    heading, _ = REFERENCE.README_PAGES[name]
    body = REFERENCE.readme_section(heading)
    assert body.strip() and "\n## " not in body


def test_a_readme_link_outside_the_docs_is_refused_for_the_site() -> None:
    assert REFERENCE.site_links("[a](docs/pools.md#x) [b](https://x.y/z)") == (
        "[a](pools.md#x) [b](https://x.y/z)"
    )
    with pytest.raises(ValueError, match=r"benchmarks/README\.md"):
        REFERENCE.site_links("see [it](benchmarks/README.md)")


def test_the_pages_cover_what_they_are_generated_from() -> None:
    from snooze.cli import COMMANDS
    from snooze.gateway.metrics import GatewayMetrics
    from snooze.operator.metrics import OperatorMetrics

    cli = (ROOT / "docs" / "reference" / "cli.md").read_text()
    assert all(f"## `snooze {command}`" in cli for command in COMMANDS)
    metrics = (ROOT / "docs" / "reference" / "metrics.md").read_text()
    for registry in (OperatorMetrics().registry, GatewayMetrics().registry):
        for family in registry.collect():
            name = family.name + ("_total" if family.type == "counter" else "")
            name += "_info" if family.type == "info" else ""
            assert f"`{name}`" in metrics, name
    crd = (ROOT / "docs" / "reference" / "crd.md").read_text()
    for field in (
        "`idle.after`",
        "`wake.onFailure`",
        "`pool.memory`",
        "`memory`",
        "`headroom.wakes`",
    ):
        assert field in crd, field


def test_a_pipe_in_code_does_not_end_a_table_cell() -> None:
    assert REFERENCE.code("a|b\\.c") == "<code>a&#124;b&#92;.c</code>"
    assert REFERENCE.code("plain") == "`plain`"
