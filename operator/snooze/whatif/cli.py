"""`snooze whatif`: compare policies on a request trace (and `snooze whatif convert`: make a
trace from a Prometheus range query of the gateway's request counter)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields
from pathlib import Path

from snooze.durations import duration_flag
from snooze.whatif.latency import Latencies
from snooze.whatif.trace import Request

LATENCY_FLAGS = {
    "sleep_seconds": "a level-1 sleep",
    "level2_sleep_seconds": "a level-2 sleep",
    "wake_seconds": "bringing the weights back on wake",
    "kv_wake_seconds": "re-allocating the KV cache on wake",
    "reload_seconds": "reloading the weights after a level-2 sleep",
    "cold_start_seconds": "a scale-up from zero until the engine answers",
    "token_seconds": "each generated token",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", type=Path, metavar="FILE", help="the request trace (CSV)")
    parser.add_argument(
        "--policy",
        action="append",
        default=[],
        metavar="SPEC",
        help="a policy to compare (repeatable): always-on, fixed:10m, tiers:10m,24h, auto, "
        "auto:1m,30m, schedule:FILE, prewake, prewake:2m, prewake:2m,5m, or an InferenceModel "
        "YAML file",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("snooze-whatif"),
        metavar="DIR",
        help="where to write whatif.png and whatif.json (default: snooze-whatif)",
    )
    parser.add_argument(
        "--measure-from",
        default=None,
        metavar="TIME",
        help="count only from this time on (seconds, ISO 8601, or a share of the trace such "
        "as 50%%): what came before only trains pre-wake and Auto",
    )
    parser.add_argument(
        "--engines", type=int, default=None, metavar="N", help="engines per model (default: 1)"
    )
    defaults = Latencies()
    for name, what in LATENCY_FLAGS.items():
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            type=duration_flag(zero=True),
            default=getattr(defaults, name),
            metavar="DURATION",
            help=f"the time of {what} (default: {getattr(defaults, name)}s)",
        )
    parser.add_argument(
        "--pinning-share",
        type=float,
        default=defaults.pinning_share,
        metavar="F",
        help="the part of an engine's first level-1 sleep spent pinning host RAM, which its "
        f"later level-1 sleeps skip (default: {defaults.pinning_share})",
    )
    sub = parser.add_subparsers(dest="action", metavar="convert")
    convert = sub.add_parser(
        "convert",
        help="make a trace from a Prometheus range query of snooze_gateway_requests_total",
        description="Make a whatif trace from the JSON of Prometheus' /api/v1/query_range for "
        "snooze_gateway_requests_total (each step's increase spread evenly over the step).",
    )
    convert.add_argument("--prometheus", type=Path, required=True, metavar="FILE")
    convert.add_argument(
        "--output", type=Path, default=None, metavar="FILE", help="default: standard output"
    )


def run(args: argparse.Namespace) -> int:
    from snooze.whatif.trace import TraceError

    try:
        if args.action == "convert":
            return _convert(args)
        return _compare(args)
    except TraceError as exc:
        print(f"snooze whatif: {exc}", file=sys.stderr)
        return 2


def _convert(args: argparse.Namespace) -> int:
    from snooze.whatif.convert import from_prometheus
    from snooze.whatif.trace import TraceError, write

    try:
        text = args.prometheus.read_text(encoding="utf-8")
    except OSError as exc:
        raise TraceError(f"{args.prometheus}: cannot read it: {exc.strerror or exc}") from None
    requests = from_prometheus(text, source=str(args.prometheus))
    out = write(requests, header_comment=f"converted from {args.prometheus.name}")
    if args.output is None:
        sys.stdout.write(out)
    else:
        args.output.write_text(out, encoding="utf-8")
        print(f"wrote {len(requests)} requests to {args.output}", file=sys.stderr)
    return 0


def _compare(args: argparse.Namespace) -> int:
    from snooze.whatif import policies, report, trace

    if args.trace is None or not args.policy:
        print(
            "snooze whatif: give --trace FILE and at least one --policy SPEC, such as "
            "--policy always-on --policy fixed:10m",
            file=sys.stderr,
        )
        return 2
    if args.engines is not None and args.engines < 1:
        print("snooze whatif: --engines must be at least 1", file=sys.stderr)
        return 2
    for field in fields(Latencies):
        value = getattr(args, field.name, None)
        if isinstance(value, float) and value < 0:
            flag = field.name.replace("_", "-")
            print(f"snooze whatif: --{flag} must not be negative", file=sys.stderr)
            return 2
    if not 0 <= args.pinning_share < 1:
        print("snooze whatif: --pinning-share must be at least 0 and below 1", file=sys.stderr)
        return 2
    try:
        chosen = [policies.parse(text) for text in args.policy]
    except policies.PolicyError as exc:
        print(f"snooze whatif: {exc}", file=sys.stderr)
        return 2
    requests = trace.read(args.trace)
    measure_from = _measure_from(args.measure_from, requests)
    latencies = Latencies(
        **{name: getattr(args, name) for name in LATENCY_FLAGS},
        pinning_share=args.pinning_share,
    )
    if args.engines is not None:
        chosen = [
            policies.Policy(name=p.name, spec=p.spec, engines=args.engines, note=p.note)
            for p in chosen
        ]
    for policy in chosen:
        if policy.note:
            print(f"note: {policy.name}: {policy.note}", file=sys.stderr)
    results = [
        report.evaluate(p, requests, latencies=latencies, measure_from=measure_from) for p in chosen
    ]
    models = len({r.model for r in requests})
    span = (requests[-1].at - requests[0].at) / 3600
    print(f"{args.trace.name}: {len(requests)} requests, {models} models, {span:.1f} hours")
    print(report.table(results))
    args.out.mkdir(parents=True, exist_ok=True)
    line = report.json_line(results)
    (args.out / "whatif.json").write_text(line + "\n", encoding="utf-8")
    try:
        report.plot(results, args.out / "whatif.png", title=f"snooze whatif: {args.trace.name}")
        print(f"wrote {args.out / 'whatif.png'} and {args.out / 'whatif.json'}")
    except report.PlotError as exc:
        print(f"snooze whatif: {exc}", file=sys.stderr)
        print(f"wrote {args.out / 'whatif.json'}")
    print(line)
    return 0


def _measure_from(text: str | None, requests: list[Request]) -> float | None:
    from snooze.whatif.trace import TraceError, parse_time

    if text is None:
        return None
    first, last = requests[0].at, requests[-1].at
    if text.endswith("%"):
        try:
            share = float(text[:-1]) / 100
        except ValueError:
            share = -1.0
        if not 0 <= share <= 1:
            raise TraceError(f"--measure-from {text}: a share is 0% to 100%")
        return first + share * (last - first)
    try:
        return parse_time(text)
    except ValueError as exc:
        raise TraceError(f"--measure-from: {exc}") from None
