"""The README's "What will it save?" and docs/whatif.md as a person reads them: their command
blocks, the commands those hold, a bash to run them exactly as printed from the repository's
root (with `snooze` this interpreter's), and the figures the pages print, made from a
command's JSON as the pages write them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import docs_pages

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## What will it save?"
TRACE = "--trace traces/servegen-14d-17m.csv.gz --measure-from 604800"
COMPARE = (
    f"snooze whatif {TRACE} --policy always-on --policy fixed:10m --policy fixed:1m "
    '--policy tiers:10m,1h --policy tiers:10m,2h --out "$(mktemp -d)"'
)
PLAN_FLAGS = "--device-memory 80Gi --model-memory 36Gi,2Gi --target-p99 2s --prime 10s"
PLAN = f'snooze whatif plan {TRACE} {PLAN_FLAGS} --out "$(mktemp -d)"'
POOL_FLAGS = (
    f"snooze whatif {TRACE} --pool gpu-a=m06,m07,m08,m15 --device-memory 80Gi "
    '--model-memory 36Gi,2Gi --policy always-on --policy fixed:10m --out "$(mktemp -d)"'
)
PLAN_BLOCK = "\n".join(
    [
        "out=$(mktemp -d)",
        f"snooze whatif plan {TRACE} {PLAN_FLAGS} --out $out",
        f"snooze whatif {TRACE} --pools $out/manifests --policy declared --out $out",
        "kubectl apply -f $out/manifests/",
    ]
)
README_BLOCKS = [f"{COMPARE}\n{PLAN}"]
DOCS_BLOCKS = [*README_BLOCKS, POOL_FLAGS, PLAN_BLOCK]
LABELS = {
    "always-on": "always on",
    "fixed:10m": "asleep after 10 minutes idle (`fixed:10m`)",
    "fixed:1m": "asleep after 1 minute idle (`fixed:1m`)",
    "tiers:10m,1h": "asleep after 10 minutes, zero replicas after 1 hour (`tiers:10m,1h`)",
    "tiers:10m,2h": "asleep after 10 minutes, zero replicas after 2 hours (`tiers:10m,2h`)",
}
WEEK_HOURS = 7 * 24


def readme_section() -> str:
    return docs_pages.section("README.md", SECTION)


def docs() -> str:
    return docs_pages.read("docs/whatif.md")


def sh_blocks(text: str) -> list[str]:
    return [b.body.strip() for b in docs_pages.command_blocks(text)]


def bash(
    script: str, tmp: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `script` as printed, in bash from the repository's root, with `snooze` this
    interpreter's and temporary folders under `tmp`; the tree must be as it was after."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    snooze = bin_dir / "snooze"
    snooze.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m snooze.cli "$@"\n')
    snooze.chmod(0o755)
    (tmp / "tmp").mkdir(exist_ok=True)
    full = {
        **os.environ,
        **(env or {}),
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "TMPDIR": str(tmp / "tmp"),
    }
    before = _tree()
    done = subprocess.run(
        ["bash", "-e", "-c", script], cwd=ROOT, env=full, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert _tree() == before, "the commands wrote into the tree"
    return done


def _tree() -> str:
    return subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip


def json_lines(out: str, key: str) -> list[Any]:
    import json

    return [json.loads(line)[key] for line in out.splitlines() if line.startswith(f'{{"{key}"')]


def seconds(value: float) -> str:
    if value == 0:
        return "0 s"
    return f"{value:.0f} s" if value >= 10 else f"{value:.2f} s"


def held_p99(p: dict[str, Any]) -> str:
    return seconds(p["added_latency_p99_s"]) if p["held_requests"] else "-"


def readme_row(label: str, p: dict[str, Any]) -> str:
    mean = p["device_hours_held"] / WEEK_HOURS
    devices = f"{mean:.0f}" if round(mean, 1) == round(mean) else f"{mean:.1f}"
    return (
        f"| {label} | {devices} ({p['devices_peak']}) | {p['held_requests']:,} | "
        f"{seconds(p['added_latency_p99_all_s'])} | {held_p99(p)} |"
    )


def docs_row(label: str, p: dict[str, Any]) -> str:
    return (
        f"| {label} | {p['device_hours_held']:,.0f} | {p['devices_peak']} | "
        f"{p['gpu_hours_awake']:,.0f} | {p['wakes']:,} | {p['cold_starts']:,} | "
        f"{p['held_requests']:,} | {seconds(p['added_latency_p99_all_s'])} | {held_p99(p)} |"
    )
