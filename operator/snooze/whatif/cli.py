"""`snooze whatif`: compare policies on a request trace, with or without GPU pools; `snooze
whatif plan`: the packing of models onto devices with the fewest devices that meets a latency
target; `snooze whatif convert`: a trace from a Prometheus range query of the gateway's
request counter."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from snooze.whatif import flags


def add_arguments(parser: argparse.ArgumentParser) -> None:
    flags.add_common(parser, out="snooze-whatif")
    parser.add_argument(
        "--policy",
        action="append",
        default=[],
        metavar="SPEC",
        help="a policy to compare (repeatable): always-on, fixed:10m, tiers:10m,24h, auto, "
        "auto:1m,30m, schedule:FILE, prewake, prewake:2m, prewake:2m,5m, an InferenceModel "
        "YAML file, or declared (each model as its InferenceModel given with --pools says)",
    )
    parser.add_argument(
        "--engines", type=int, default=None, metavar="N", help="engines per model (default: 1)"
    )
    parser.add_argument(
        "--pools",
        action="append",
        type=Path,
        default=[],
        metavar="FILE",
        help="GPUPool and InferenceModel manifests (a file or a folder of .yaml files): each "
        "InferenceModel with spec.pool shares its pool's device (repeatable)",
    )
    parser.add_argument(
        "--pool",
        action="append",
        default=[],
        metavar="NAME=MODEL,MODEL...",
        help="a pool of these models on one device of --device-memory (repeatable)",
    )
    sub = parser.add_subparsers(dest="action", metavar="plan | convert")
    from snooze.whatif import plan_cli

    plan_cli.add_parser(sub)
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
    from snooze.whatif.layout import LayoutError
    from snooze.whatif.policies import PolicyError
    from snooze.whatif.trace import TraceError

    try:
        if args.action == "convert":
            return _convert(args)
        if args.action == "plan":
            from snooze.whatif import plan_cli

            return plan_cli.run(args)
        from snooze.whatif import compare

        return compare.run(args)
    except (TraceError, LayoutError, PolicyError, flags.UsageError) as exc:
        flags.forget_out(args)
        print(f"snooze whatif: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # writing the results: a full disk, a folder where a file goes
        flags.forget_out(args)
        print(f"snooze whatif: cannot write {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2


def _convert(args: argparse.Namespace) -> int:
    from snooze.whatif.convert import from_prometheus
    from snooze.whatif.trace import TraceError, write

    try:
        text = args.prometheus.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"{args.prometheus}: cannot read it: {exc}") from None
    requests = from_prometheus(text, source=str(args.prometheus))
    out = write(requests, header_comment=f"converted from {args.prometheus.name}")
    if args.output is None:
        sys.stdout.write(out)
    else:
        args.output.write_text(out, encoding="utf-8")
        print(f"wrote {len(requests)} requests to {args.output}", file=sys.stderr)
    return 0
