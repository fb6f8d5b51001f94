"""`snooze sim --engine sglang`: the flags of a simulated SGLang server (its release, its
launch flags, its failure modes), and the configs they make."""

from __future__ import annotations

import argparse
from dataclasses import fields, replace

from snooze.api.durations import duration_flag
from snooze.sim.engine import EngineConfig
from snooze.sim.sglang.contract import DEFAULT_SGLANG_VERSION

ENGINES = ("vllm", "sglang")
# The timings whose vLLM defaults mean something else on SGLang (sim/sglang/engine.py).
_TIMINGS = ("sleep_seconds", "level2_sleep_seconds", "wake_seconds", "reload_seconds")


def _sglang_release(text: str) -> str:
    from snooze.sim.sglang.contract import parse_sglang_release

    try:
        parse_sglang_release(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


_sglang_release.__name__ = "release"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags that choose and shape an SGLang server; the others apply to both engines."""
    add = parser.add_argument
    add(
        "--engine",
        choices=ENGINES,
        default="vllm",
        help="which engine to speak: vLLM's contract, or SGLang's (release and resume by tag,"
        " pause and continue, its metrics and errors) (default: %(default)s)",
    )
    add(
        "--sglang-version",
        type=_sglang_release,
        default=DEFAULT_SGLANG_VERSION,
        metavar="X.Y.Z",
        help="with --engine sglang: the SGLang release whose HTTP contract to speak, from"
        " 0.4.9 (default: %(default)s)",
    )
    add(
        "--no-memory-saver",
        action="store_true",
        help="with --engine sglang: as a server started without --enable-memory-saver, whose"
        " release answers 200 and frees nothing",
    )
    add(
        "--weights-cpu-backup",
        action="store_true",
        help="with --engine sglang: as --enable-weights-cpu-backup, released weights keep a"
        " host copy (otherwise a resume needs /update_weights_from_disk)",
    )
    add(
        "--no-metrics",
        action="store_true",
        help="with --engine sglang: as a server started without --enable-metrics (/metrics 404)",
    )
    add("--api-key", metavar="KEY", help="with --engine sglang: as its --api-key")
    add(
        "--admin-api-key",
        metavar="KEY",
        help="with --engine sglang: as its --admin-api-key (0.5.8+): the admin routes want it",
    )
    add(
        "--release-lag",
        type=duration_flag(zero=True),
        metavar="DURATION",
        default=0.0,
        help="with --engine sglang: a release answers this long before its memory is back on"
        " the device (default: %(default)ss)",
    )
    add(
        "--no-health-generation",
        action="store_true",
        help="with --engine sglang: as SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false (0.5.8+):"
        " /health answers at once, paused or not",
    )
    add(
        "--health-timeout",
        type=duration_flag(),
        metavar="DURATION",
        default=20.0,
        help="with --engine sglang: as SGLANG_HEALTH_CHECK_TIMEOUT, how long /health waits on a"
        " paused server before 503 (default: %(default)ss)",
    )


def sglang_configs(args: argparse.Namespace, configs: list[EngineConfig]) -> list[EngineConfig]:
    """The configs as SGLang servers when `--engine sglang` (unchanged otherwise); a timing
    left at vLLM's default takes SGLang's."""
    if args.engine != "sglang":
        return configs
    from snooze.sim.sglang.engine import SGLangConfig

    vllm, sglang = EngineConfig(), SGLangConfig()
    out: list[EngineConfig] = []
    for config in configs:
        values = {f.name: getattr(config, f.name) for f in fields(config)}
        for name in _TIMINGS:
            if values[name] == getattr(vllm, name):
                values[name] = getattr(sglang, name)
        out.append(
            replace(
                SGLangConfig(**values),
                sglang_version=args.sglang_version,
                memory_saver=not args.no_memory_saver,
                weights_cpu_backup=args.weights_cpu_backup,
                metrics=not args.no_metrics,
                api_key=args.api_key,
                admin_api_key=args.admin_api_key,
                release_lag_seconds=args.release_lag,
                health_generation=not args.no_health_generation,
                health_timeout_seconds=args.health_timeout,
            )
        )
    return out
