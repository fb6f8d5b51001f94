"""`snooze demo`: the whole system on this machine, a minute of traffic, a summary and a PNG."""

from __future__ import annotations

import argparse
from pathlib import Path

from snooze.api.durations import duration_flag


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--duration",
        type=duration_flag(),
        default=60.0,
        metavar="DURATION",
        help="length of the scenario, such as 90 (seconds) or 2m; its traffic is stretched to "
        "fit (default: 1m)",
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        metavar="FACTOR",
        help="multiply every engine latency and idle timer: 0.25 makes them 4x shorter "
        "(default: 1)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("snooze-demo"),
        metavar="DIR",
        help="where the timeline PNG, summary.json and the log go (default: ./snooze-demo)",
    )
    parser.add_argument(
        "--port", type=int, default=8080, help="the gateway's port; 0 picks one (default: 8080)"
    )
    parser.add_argument(
        "--prometheus",
        action="store_true",
        help="run a real Prometheus (the `prometheus` binary) scraping the operator and the "
        "gateway, and plot the dashboard's panels from it (OUT/dashboard.png)",
    )
    parser.add_argument(
        "--hybrid-wake-crash",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the unpatched hybrid model's engine crashes on wake, as vLLM 0.12.0 to 0.26.x "
        "do (issue #41564; default: on)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the traffic's jitter")


def run(args: argparse.Namespace) -> int:
    if args.duration <= 0 or args.time_scale <= 0:
        raise SystemExit("snooze demo: --duration and --time-scale must be greater than zero")
    from snooze.api.listening import CannotListen, exit_cannot_listen
    from snooze.demo.run import Options, main

    options = Options(
        duration=args.duration,
        scale=args.time_scale,
        out=args.out,
        port=args.port,
        prometheus=args.prometheus,
        hybrid_crash=args.hybrid_wake_crash,
        seed=args.seed,
        log_level=args.log_level,
    )
    try:
        return main(options)
    except CannotListen as exc:  # its gateway's port (the others are free ones it picks)
        return exit_cannot_listen("demo", exc, what="the gateway", port_flag="--port")
