"""`snooze whatif --trace FILE --policy ...`: every policy replayed over the trace (in the pools
given, if any), a table, a picture and one line of JSON."""

from __future__ import annotations

import argparse
import sys

from snooze.whatif import picture, policies, report, trace
from snooze.whatif.flags import UsageError, latencies, layout_of, measure_from, out_folder


def run(args: argparse.Namespace) -> int:
    if args.trace is None or not args.policy:
        raise UsageError(
            "give --trace FILE and at least one --policy SPEC, such as --policy always-on "
            "--policy fixed:10m"
        )
    if args.engines is not None and args.engines < 1:
        raise UsageError("--engines must be at least 1")
    lat = latencies(args)
    out_folder(args, "snooze-whatif")
    requests = trace.read(args.trace)
    layout = layout_of(args, list(requests.models))
    chosen = [
        policies.declared(layout.specs) if text == policies.DECLARED else policies.parse(text)
        for text in args.policy
    ]
    if args.engines is not None:
        chosen = [
            policies.Policy(
                name=p.name, spec=p.spec, engines=args.engines, note=p.note, per_model=p.per_model
            )
            for p in chosen
        ]
    for policy in chosen:
        if policy.note:
            print(f"note: {policy.name}: {policy.note}", file=sys.stderr)
    for pool in layout.pools:
        absent = [m for m in pool.members if m not in requests.models]
        if absent:
            print(
                f"note: GPUPool {pool.settings.name}: the trace has no request of "
                f"{', '.join(absent)}: replayed without them",
                file=sys.stderr,
            )
    start = measure_from(args.measure_from, requests.first, requests.last)
    results = [
        report.evaluate(p, requests, latencies=lat, measure_from=start, layout=layout)
        for p in chosen
    ]
    span = (requests.last - requests.first) / 3600
    pooled = sum(len(p.members) for p in layout.pools)
    pools = len(layout.pools)
    where = f", {pooled} of them in {pools} pool{'s' if pools != 1 else ''}" if pools else ""
    print(
        f"{args.trace.name}: {len(requests)} requests, {len(requests.models)} models{where}, "
        f"{span:.1f} hours"
    )
    print(report.table(results))
    print(report.sentences(results))
    line = report.json_line(results)
    (args.out / "whatif.json").write_text(line + "\n", encoding="utf-8")
    try:
        picture.policies(
            results, args.out / "whatif.png", title=f"snooze whatif: {args.trace.name}"
        )
        print(f"wrote {args.out / 'whatif.png'} and {args.out / 'whatif.json'}")
    except picture.PlotError as exc:
        print(f"snooze whatif: {exc}", file=sys.stderr)
        print(f"wrote {args.out / 'whatif.json'}")
    print(line)
    return 0
