"""The flags `snooze whatif` and `snooze whatif plan` share, and what they turn into: the trace
to read, what to count, the engines' latencies, and the GPU pools given as manifests or flags."""

from __future__ import annotations

import argparse
import contextlib
from dataclasses import fields
from pathlib import Path
from typing import Any

from snooze.api.durations import DurationError, duration_flag, parse_duration
from snooze.api.gpupool import Eviction
from snooze.api.quantities import QuantityError, parse_quantity
from snooze.policy.pool.decision import Headroom, Prime
from snooze.whatif.latency import Latencies
from snooze.whatif.layout import Layout, LayoutError, PoolFlags, from_flags, from_manifests


class UsageError(ValueError):
    """A flag that cannot be used; the message names it and says what to write."""


LATENCY_FLAGS = {
    "sleep_seconds": "a level-1 sleep",
    "level2_sleep_seconds": "a level-2 sleep",
    "wake_seconds": "bringing the weights back on wake",
    "kv_wake_seconds": "re-allocating the KV cache on wake",
    "reload_seconds": "reloading the weights after a level-2 sleep",
    "cold_start_seconds": "a scale-up from zero until the engine answers",
    "token_seconds": "each generated token",
}


def add_common(parser: argparse.ArgumentParser, *, out: str, within: bool = False) -> None:
    """The flags `snooze whatif` and `snooze whatif plan` share: the trace, where to write,
    what to count, the engines' latencies and the pools' settings. `within`: the parser of a
    subcommand, whose flags must not undo those given before its name (`snooze whatif --trace
    FILE plan ...`): they set nothing unless given."""

    def add(group: Any, *names: str, **options: Any) -> None:
        if within:
            options["default"] = argparse.SUPPRESS
        group.add_argument(*names, **options)

    add(parser, "--trace", type=Path, metavar="FILE", help="the request trace (CSV, or .csv.gz)")
    add(
        parser,
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help=f"where to write the picture and the JSON (default: {out})",
    )
    add(
        parser,
        "--measure-from",
        default=None,
        metavar="TIME",
        help="count only from this time on (seconds, ISO 8601, or a share of the trace such "
        "as 50%%): what came before only trains pre-wake and Auto",
    )
    defaults = Latencies()
    for name, what in LATENCY_FLAGS.items():
        add(
            parser,
            f"--{name.replace('_', '-')}",
            type=duration_flag(zero=True),
            default=getattr(defaults, name),
            metavar="DURATION",
            help=f"the time of {what} (default: {getattr(defaults, name)}s)",
        )
    add(
        parser,
        "--pinning-share",
        type=float,
        default=defaults.pinning_share,
        metavar="F",
        help="the part of an engine's first level-1 sleep spent pinning host RAM, which its "
        f"later level-1 sleeps skip (default: {defaults.pinning_share})",
    )
    pools = parser.add_argument_group("GPU pools given on the command line")
    add(pools, "--device-memory", default=None, metavar="QUANTITY",
        help="one device's memory, such as 80Gi")  # fmt: skip
    add(
        pools,
        "--model-memory",
        action="append",
        default=[],
        metavar="[MODEL=]AWAKE[,ASLEEP]",
        help="what an engine holds on its device awake and asleep (default asleep: 1Gi), for "
        "one model or, without MODEL=, every model (repeatable)",
    )
    for flag, default, metavar, what in (
        ("--min-residency", "30s", "DURATION", "a pool's minResidency (default: 30s)"),
        ("--headroom", None, "IDLE", "a pool's headroom (one wake) with this idleAfter, as 1m"),
        ("--prime", None, "IDLE", "a pool's prime with this idleAfter, such as 10s"),
        ("--host-memory", None, "QUANTITY", "a pool's hostMemory (default: unbounded)"),
    ):
        add(pools, flag, default=default, metavar=metavar, help=what)
    add(
        pools,
        "--eviction",
        default="LeastRecentlyUsed",
        choices=("LeastRecentlyUsed", "Cheapest"),
        help="a pool's eviction order (default: LeastRecentlyUsed)",
    )


def out_folder(args: argparse.Namespace, default: str) -> Path:
    """`--out` (or `default`), made now (before a long replay, not after it); a folder this
    made is remembered, so that a run that fails leaves nothing behind (`forget_out`)."""
    folder: Path = args.out or Path(default)
    args.out = folder
    made = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(
            f"--out {folder}: cannot make that folder: {exc.strerror or exc}"
        ) from None
    args.out_made = made
    return folder


def forget_out(args: argparse.Namespace) -> None:
    """After a failed run: remove the output folder if this run made it and left it empty."""
    folder = getattr(args, "out", None)
    if getattr(args, "out_made", False) and folder is not None:
        with contextlib.suppress(OSError):
            folder.rmdir()  # only if empty: never what another run or the user put there


def latencies(args: argparse.Namespace) -> Latencies:
    """The engines' latencies the flags give, checked."""
    for field in fields(Latencies):
        value = getattr(args, field.name, None)
        if isinstance(value, float) and not value >= 0:
            flag = field.name.replace("_", "-")
            raise UsageError(f"--{flag} must be a number of seconds, not negative")
    if not 0 <= args.pinning_share < 1:
        raise UsageError("--pinning-share must be at least 0 and below 1")
    return Latencies(
        **{name: getattr(args, name) for name in LATENCY_FLAGS},
        pinning_share=args.pinning_share,
    )


def measure_from(text: str | None, first: float, last: float) -> float | None:
    """Where counting starts, checked against the trace (its first and last request): a time
    after the last request would count nothing, and print a table of zeros as if it were a
    result."""
    from snooze.whatif.trace import TraceError, format_time, parse_time

    if text is None:
        return None
    if text.endswith("%"):
        try:
            share = float(text[:-1]) / 100
        except ValueError:
            share = -1.0
        if not 0 <= share < 1:
            raise TraceError(
                f"--measure-from {text}: a share is 0% (the whole trace) to below 100% "
                "(100% would count nothing)"
            )
        return first + share * (last - first)
    try:
        start = parse_time(text)
    except ValueError as exc:
        raise TraceError(f"--measure-from: {exc}") from None
    if start > last:
        raise TraceError(
            f"--measure-from {text}: the trace's last request is at {format_time(last)}, so "
            f"nothing would be counted; give a time from {format_time(first)} to "
            f"{format_time(last)}, or a share of the trace such as 50%"
        )
    return start


def pool_flags(args: argparse.Namespace) -> PoolFlags:
    """The pool settings of the command line, checked."""

    def duration(flag: str, text: str) -> float:
        try:
            return parse_duration(text)
        except DurationError as exc:
            raise UsageError(f"{flag}: {exc}") from None

    host = None
    if args.host_memory is not None:
        try:
            host = parse_quantity(args.host_memory)
        except QuantityError as exc:
            raise UsageError(f"--host-memory: {exc}") from None
    return PoolFlags(
        min_residency=duration("--min-residency", args.min_residency),
        eviction=Eviction(args.eviction),
        headroom=None
        if args.headroom is None
        else Headroom(wakes=1, idle_after=duration("--headroom", args.headroom)),
        prime=None if args.prime is None else Prime(idle_after=duration("--prime", args.prime)),
        host_memory=host,
    )


def device_memory(args: argparse.Namespace) -> int:
    if args.device_memory is None:
        raise UsageError("give --device-memory, one device's memory, such as 80Gi")
    try:
        return parse_quantity(args.device_memory)
    except QuantityError as exc:
        raise UsageError(f"--device-memory: {exc}") from None


def layout_of(args: argparse.Namespace, models: list[str]) -> Layout:
    if args.pools and args.pool:
        raise LayoutError("give pools either as manifests (--pools) or as flags (--pool)")
    if args.pools:
        return from_manifests(args.pools)
    if args.pool:
        return from_flags(
            args.pool,
            device_memory=device_memory(args),
            memory=args.model_memory,
            models=models,
            flags=pool_flags(args),
        )
    return Layout()
