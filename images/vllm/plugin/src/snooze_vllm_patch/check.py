"""The image's proof: load `vllm.general_plugins` as vLLM does, then inspect the method."""

from __future__ import annotations

import argparse
import dataclasses
import enum
import importlib
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from importlib.metadata import entry_points

from snooze_vllm_patch.fix import is_hybrid_safe
from snooze_vllm_patch.knownbugs import parse_serve_args, rows_for
from snooze_vllm_patch.plugin import TARGET, TARGET_CLASS, TARGET_METHOD, TARGET_MODULE
from snooze_vllm_patch.versions import Verdict, classify

GROUP = "vllm.general_plugins"

logger = logging.getLogger("snooze_vllm_patch.check")


class Status(enum.Enum):
    """The check's answer; only the last two make it fail."""

    PATCHED = "patched"
    FIXED = "fixed"
    UNAFFECTED = "unaffected"
    UNPATCHED = "unpatched"
    UNKNOWN = "unknown"

    @property
    def ok(self) -> bool:
        return self not in (Status.UNPATCHED, Status.UNKNOWN)


@dataclasses.dataclass(frozen=True)
class Report:
    """What the check found."""

    status: Status
    version: str
    detail: str
    plugins: tuple[str, ...] = ()
    """The entry point names that were loaded and called, in order."""

    def line(self) -> str:
        called = ", ".join(self.plugins) or "none"
        return f"{self.status.value}: vLLM {self.version}: {self.detail} (plugins called: {called})"


def allowed_plugins(environ: Mapping[str, str]) -> list[str] | None:
    """Read `VLLM_PLUGINS` as vLLM does: unset allows all, else a comma list (no trimming)."""
    if "VLLM_PLUGINS" not in environ:
        return None
    return environ["VLLM_PLUGINS"].split(",")


def load_general_plugins(environ: Mapping[str, str]) -> tuple[str, ...]:
    """Load and call the `vllm.general_plugins` entry points the way vLLM does.

    As in vLLM, a plugin that fails to load is logged and skipped, and a plugin function
    that raises stops everything.
    """
    allowed = allowed_plugins(environ)
    called = []
    for plugin in entry_points(group=GROUP):
        if allowed is not None and plugin.name not in allowed:
            continue
        try:
            func = plugin.load()
        except Exception:
            logger.exception("failed to load plugin %s", plugin.name)
            continue
        func()
        called.append(plugin.name)
    return tuple(called)


def run_check(environ: Mapping[str, str]) -> Report:
    """Load the plugins, then report whether the installed vLLM runs the hybrid-safe method."""
    vllm = importlib.import_module("vllm")
    version = str(getattr(vllm, "__version__", ""))
    plugins = load_general_plugins(environ)
    verdict = classify(version)
    if verdict is Verdict.BEFORE:
        return Report(Status.UNAFFECTED, version, f"{TARGET} does not exist yet", plugins)
    if verdict is Verdict.FIXED:
        return Report(Status.FIXED, version, "fixed upstream (0.27.0 and later)", plugins)
    if verdict is Verdict.UNKNOWN:
        detail = "cannot tell from this version whether it carries issue #41564"
        return Report(Status.UNKNOWN, version or "(no version)", detail, plugins)
    # Importing the module runs the patch the plugin deferred to this import.
    module = importlib.import_module(TARGET_MODULE)
    method = getattr(getattr(module, TARGET_CLASS, None), TARGET_METHOD, None)
    if method is None:
        return Report(Status.FIXED, version, f"{TARGET} is gone", plugins)
    if is_hybrid_safe(method):
        return Report(Status.PATCHED, version, f"{TARGET} is the hybrid-safe wrapper", plugins)
    detail = (
        f"{TARGET} still crashes on hybrid models; is snooze-vllm-hybrid-kv-fix installed"
        " and, if VLLM_PLUGINS is set, is snooze_hybrid_kv_fix in it?"
    )
    return Report(Status.UNPATCHED, version, detail, plugins)


def known_bugs(version: str, serve_args: str, level: int) -> tuple[list[str], bool]:
    """Lines naming each known sleep or wake bug these arguments meet on this release, and
    whether sleeping at `level` is one of them (a row that a drained sleep avoids only warns:
    Snooze drains before every sleep)."""
    rows = rows_for(version, parse_serve_args(serve_args))
    lines = [f"known bug: {row.key}: {row.what} ({row.source})" for row in rows]
    breaks = [row for row in rows if level in row.levels and not row.in_flight]
    safe = [lvl for lvl in (1, 2) if not any(lvl in r.levels and not r.in_flight for r in rows)]
    if breaks:
        advice = f"use sleep level {safe[0]}" if safe else "do not put this engine to sleep"
        lines.append(f"sleep level {level} breaks here: {advice}")
    if any(row.in_flight for row in rows):
        lines.append("never send /sleep with requests in flight: drain first")
    return lines, bool(breaks)


def main(argv: Sequence[str] | None = None) -> int:
    """Print one line (and, with --serve-args, one per known bug) and return the exit status.

    0: patched, fixed or unaffected, and no known bug at --sleep-level; 1: unpatched, a version
    it cannot place, or a known bug at --sleep-level; 2: vLLM or its model runner cannot be
    imported here.
    """
    parser = argparse.ArgumentParser(
        prog="snooze-vllm-check",
        description="Check that vLLM runs the hybrid-safe init_fp8_kv_scales (issue #41564)"
        " and, given the engine's arguments, that sleep and wake are not known to break.",
    )
    parser.add_argument(
        "--serve-args",
        metavar="ARGS",
        help="the engine's `vllm serve` arguments, as one string: report the known sleep and"
        " wake bugs they meet on this vLLM release (LoRA, tensor and pipeline parallel)",
    )
    parser.add_argument(
        "--sleep-level",
        type=int,
        choices=(1, 2),
        default=1,
        help="the sleep level the engine will be put to sleep at (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    try:
        report = run_check(os.environ)
    except ImportError as error:
        # Most likely the module the patch targets failed to import (see README).
        print(f"error: cannot inspect vLLM here: {error}", file=sys.stderr)
        return 2
    print(report.line(), file=sys.stdout if report.status.ok else sys.stderr)
    code = 0 if report.status.ok else 1
    if args.serve_args is not None:
        lines, broken = known_bugs(report.version, args.serve_args, args.sleep_level)
        for line in lines:
            print(line, file=sys.stderr if broken else sys.stdout)
        if broken:
            code = 1
    return code
