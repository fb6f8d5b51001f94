"""The README's "What will it save?" and docs/whatif.md: every command they print, run exactly as
printed (the plan's, with the sandbox, in tests/e2e/test_whatif_plan.py), and every figure of
theirs that a command prints, checked against what it printed."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import whatif_pages as pages

from snooze.cli import main
from snooze.whatif import trace


def test_the_pages_print_these_commands() -> None:
    assert pages.sh_blocks(pages.readme_section()) == pages.README_BLOCKS
    assert pages.sh_blocks(pages.docs()) == pages.DOCS_BLOCKS


def test_the_readme_compare_command_gives_its_figures(tmp_path: Path) -> None:
    done = pages.bash(pages.COMPARE, tmp_path)
    [policies] = pages.json_lines(done.stdout, "policies")
    readme, docs = pages.readme_section(), pages.docs()
    for p in policies:
        assert pages.readme_row(pages.LABELS[p["name"]], p) in readme, p["name"]
        assert pages.readme_row(pages.LABELS[p["name"]], p) in docs, p["name"]
        assert pages.docs_row(f"`{p['name']}`", p) in docs, p["name"]
    by = {p["name"]: p for p in policies}
    # What the README says of them: sleep alone holds every device; scale to zero averages
    # fewer but peaks at 9 and 10, with cold starts of 60 s.
    assert all(by[n]["devices_peak"] == 17 for n in ("always-on", "fixed:10m", "fixed:1m"))
    assert [by[n]["devices_peak"] for n in ("tiers:10m,1h", "tiers:10m,2h")] == [9, 10]
    assert by["tiers:10m,1h"]["added_latency_p99_s"] == 60.0
    # The sentence the docs quote is the one the command printed.
    [quoted] = [line for line in pages.docs().splitlines() if line.startswith("tiers:10m,1h: ")]
    assert quoted in done.stdout.splitlines()
    # Written where the command said, not into the tree (bash() checks the tree).
    assert (Path(done.stdout.split("wrote ")[1].split(" and ")[0])).exists()


def test_the_docs_pool_flags_command(tmp_path: Path) -> None:
    done = pages.bash(pages.POOL_FLAGS, tmp_path)
    assert "17 models, 4 of them in 1 pool," in done.stdout
    [policies] = pages.json_lines(done.stdout, "policies")
    always, fixed = policies
    # 13 devices of their own and one pool's: the week's device-hours of 14.
    assert always["devices_peak"] == fixed["devices_peak"] == 14
    assert always["device_hours_held"] == pytest.approx(14 * pages.WEEK_HOURS, rel=1e-3)
    assert always["swaps"] > 0 and always["held_requests"] > 0


def test_the_docs_convert_command_runs_as_printed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = {
        "status": "success",
        "data": {
            "resultType": "matrix",
            "result": [
                {"metric": {"model": "chat", "code": "200"}, "values": [[0, "0"], [60, "2"]]}
            ],
        },
    }
    monkeypatch.chdir(tmp_path)
    Path("requests.json").write_text(json.dumps(body))
    docs = pages.docs()
    command = docs[docs.index("`snooze whatif convert") + 1 :].split("`")[0]
    assert main(shlex.split(command)[1:]) == 0
    assert [r.at for r in trace.read(Path("trace.csv")).requests()] == [15.0, 45.0]
