"""The operator's sizing figures come from one place, the fleet table of benchmarks/README.md:
every "N cores and M MB at K models" that the chart's values, the chart's README and the docs
print is a row of that table, the copy in docs/scale.md is that table, and the default memory
limit holds what the docs say it fits."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
QUOTED = re.compile(r"([\d.]+)\s+cores\s+and\s+([\d,]+)\s+MB\s+at\s+([\d,]+)\s+models")
QUOTING = ["charts/snooze/values.yaml", "charts/snooze/README.md", "docs/install.md"]


def fleet_table(text: str) -> list[str]:
    start = text.index("| fleet | traffic |")
    return text[start:].split("\n\n", 1)[0].splitlines()


def measured() -> dict[int, tuple[str, str]]:
    """Models -> (cores, peak RSS MB) through the gateway, as the benchmarks' table says."""
    rows = {}
    for line in fleet_table((ROOT / "benchmarks" / "README.md").read_text())[2:]:
        fleet, traffic, _, cores, rss, _ = (c.strip() for c in line.strip("|").split("|"))
        if traffic == "through the gateway":
            rows[int(fleet.split(" x ")[0].replace(",", ""))] = (cores, rss)
    return rows


@pytest.mark.parametrize("page", QUOTING)
def test_quoted_figures_are_the_benchmarks(page: str) -> None:
    text = " ".join((ROOT / page).read_text().replace("#", " ").split())
    quoted = QUOTED.findall(text)
    assert len(quoted) >= 3, f"{page} quotes no sizing figures"
    table = measured()
    for cores, rss, models in quoted:
        assert table.get(int(models.replace(",", ""))) == (cores, rss.replace(",", "")), (
            f"{page}: {cores} cores and {rss} MB at {models} models is no row of the benchmarks"
        )


def test_the_scale_page_copies_the_table() -> None:
    source = fleet_table((ROOT / "benchmarks" / "README.md").read_text())
    assert fleet_table((ROOT / "docs" / "scale.md").read_text()) == source


def test_the_default_memory_limit_holds_a_thousand_models_not_ten() -> None:
    """What the values say: the defaults fit a few thousand models, 10,000 need more."""
    limit = yaml.safe_load((ROOT / "charts" / "snooze" / "values.yaml").read_text())["operator"][
        "resources"
    ]["limits"]["memory"]
    mib = int(limit.removesuffix("Mi"))
    table = measured()
    assert float(table[1000][1]) * 1e6 < mib * 2**20 < float(table[10000][1]) * 1e6
