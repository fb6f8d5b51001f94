"""`snooze whatif plan`: the packing of a trace's models onto devices with the fewest devices
the search finds at a p99 latency target; a table, a picture of every candidate it tried, the
manifests to apply, and one line of JSON."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from snooze.api.durations import DurationError, parse_duration
from snooze.api.models import KIND, NEVER, InferenceModelSpec, describe_validation_error
from snooze.whatif import flags, manifests, picture, plan, report, trace
from snooze.whatif.layout import Layout, LayoutError, memory_of
from snooze.whatif.policies import SELECTOR, Policy


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "plan",
        help="find the packing of models onto devices with the fewest devices at a latency "
        "target, and write its GPUPool and InferenceModel manifests",
        description="Find the packing of the trace's models onto devices with the fewest "
        "devices at which every model's p99 added latency stays within --target-p99, each "
        "candidate pool replayed through the pool's real decision.",
    )
    flags.add_common(parser, out="snooze-plan", within=True)
    parser.add_argument(
        "--target-p99",
        default="2s",
        metavar="DURATION",
        help="the p99 added latency every model must keep (default: 2s)",
    )
    parser.add_argument(
        "--idle-after",
        default=NEVER,
        metavar="DURATION",
        help="pool members' idle.after (default: Never: a member sleeps only to make room)",
    )
    parser.add_argument(
        "--sleep-level", type=int, choices=(1, 2), default=1, help="pool members' sleep level"
    )
    parser.add_argument(
        "--engine-kind",
        choices=("vllm", "sglang"),
        default="vllm",
        help="pool members' engine (spec.engine.kind): their sleeps and wakes take its times "
        "(default: vllm)",
    )
    parser.add_argument(
        "--tries",
        type=int,
        default=10,
        metavar="N",
        help="pools replayed per step before the search stops (default: 10)",
    )
    parser.add_argument(
        "--models",
        action="append",
        type=Path,
        default=[],
        metavar="FILE",
        help="your InferenceModel manifests (a file or a folder of .yaml files): the plan's "
        "are written from them (by spec.modelName, else the name); others are made new",
    )


def _member_spec(args: argparse.Namespace) -> InferenceModelSpec:
    try:
        if args.idle_after != NEVER:
            parse_duration(args.idle_after)
        return InferenceModelSpec.model_validate(
            {
                "selector": SELECTOR,
                "idle": {"after": args.idle_after},
                "sleep": {"level": args.sleep_level},
                "engine": {"kind": args.engine_kind},
            }
        )
    except DurationError as exc:
        raise flags.UsageError(f"--idle-after: {exc}") from None
    except ValidationError as exc:
        raise flags.UsageError(describe_validation_error(exc, prefix="--idle-after")) from None


def _bases(paths: list[Path]) -> dict[str, dict[str, Any]]:
    from snooze.whatif.layout import from_manifests

    bases: dict[str, dict[str, Any]] = {}
    if not paths:
        return bases
    from_manifests(paths)  # checks every document first, with its errors
    import yaml

    for path in paths:
        files = sorted(path.glob("*.y*ml")) if path.is_dir() else [path]
        for file in files:
            for doc in yaml.safe_load_all(file.read_text(encoding="utf-8")):
                if isinstance(doc, dict) and doc.get("kind") == KIND:
                    spec = doc.get("spec") or {}
                    name = spec.get("modelName") or (doc.get("metadata") or {}).get("name")
                    bases[str(name)] = doc
    return bases


def run(args: argparse.Namespace) -> int:
    if args.trace is None:
        raise flags.UsageError("give --trace FILE")
    if args.tries < 1:
        raise flags.UsageError("--tries must be at least 1")
    try:
        target = parse_duration(args.target_p99)
    except DurationError as exc:
        raise flags.UsageError(f"--target-p99: {exc}") from None
    lat = flags.latencies(args)
    flags.out_folder(args, "snooze-plan")
    memory = flags.device_memory(args)
    member = _member_spec(args)
    _bases(args.models)  # refused before the search, not after
    requests = trace.read(args.trace)
    if len(requests.models) > plan.MODELS_LIMIT:
        raise flags.UsageError(
            f"the trace has {len(requests.models)} models and a plan takes at most "
            f"{plan.MODELS_LIMIT} (its search weighs every pair of groups at each step): plan "
            "a part of them at a time, such as those of one team or one GPU type"
        )
    default, named = memory_of(args.model_memory)
    missing = [m for m in requests.models if m not in named and default is None]
    if missing:
        raise LayoutError(
            f"how much memory does {missing[0]} take? Give --model-memory AWAKE,ASLEEP for "
            "every model (such as 36Gi,2Gi), or MODEL=AWAKE,ASLEEP for each"
        )
    sizes = {m: named.get(m) or default for m in requests.models}
    start = flags.measure_from(args.measure_from, requests.first, requests.last)
    settings = plan.PlanSettings(
        device_memory=memory,
        sizes={m: s for m, s in sizes.items() if s is not None},
        target=target,
        pool=flags.pool_flags(args),
        member=member,
        latencies=lat,
        measure_from=requests.first if start is None else start,
        tries=args.tries,
    )
    too_big = [m for m, s in settings.sizes.items() if s.memory > memory]
    if too_big:
        raise LayoutError(f"{too_big[0]} takes more than --device-memory {args.device_memory}")
    found = plan.search(requests, settings, progress=lambda line: print(line, file=sys.stderr))
    layout = plan.layout_of(found, settings)
    alone = sorted(m for g in found.groups if len(g) == 1 for m in g)
    fleet = _fleet(requests, settings, layout, alone)
    _print(args, requests, found, layout, alone, fleet, settings)
    return 0


def _fleet(
    requests: trace.Trace, settings: plan.PlanSettings, layout: Layout, alone: list[str]
) -> report.Result:
    """The whole packing replayed: pools as planned, the models alone always awake (on a
    device of its own, a sleep gives nothing back)."""
    awake = settings.member.model_copy(
        update={"idle": settings.member.idle.model_copy(update={"after": NEVER})}
    )
    policy = Policy(name="plan", spec=settings.member, per_model={m: awake for m in alone})
    return report.evaluate(
        policy,
        requests,
        latencies=settings.latencies,
        measure_from=settings.measure_from,
        layout=layout,
    )


def _print(
    args: argparse.Namespace,
    requests: trace.Trace,
    found: plan.Plan,
    layout: Layout,
    alone: list[str],
    fleet: report.Result,
    settings: plan.PlanSettings,
) -> None:
    rows = [("device", "models", "requests", "held", "p99 added (worst)", "swaps")]
    pools = []
    for pool in layout.pools:
        verdict = found.verdicts[frozenset(pool.members)]
        worst = max(verdict.p99, key=lambda m: (verdict.p99[m], m))
        rows.append(
            (
                f"GPUPool {pool.settings.name}",
                ", ".join(pool.members),
                str(verdict.requests),
                str(verdict.held),
                f"{verdict.worst:.2f}s ({worst})",
                str(verdict.swaps),
            )
        )
        pools.append(
            {
                "name": pool.settings.name,
                "models": list(pool.members),
                "p99_s": round(verdict.worst, 3),
                "requests": verdict.requests,
                "held": verdict.held,
                "swaps": verdict.swaps,
            }
        )
    for model in alone:
        count = fleet.per_model[model].requests
        rows.append((f"alone: {model}", model, str(count), "0", "0.00s", "0"))
    models = len(requests.models)
    print(
        f"{args.trace.name}: {models} models on {found.devices} devices instead of {models} "
        f"(each always on, on its own): {models - found.devices} saved, every model's p99 "
        f"added latency within {settings.target:g}s"
    )
    print(report.aligned(rows))
    print(
        f"searched in {found.seconds:.1f}s: {found.replays} pools replayed, "
        f"{len(found.candidates)} packings"
    )
    files = manifests.build(
        layout.pools, alone, settings.member, sizes=settings.sizes, bases=_bases(args.models)
    )
    written = manifests.write(args.out / "manifests", files)
    print(f"wrote {len(written)} manifest files to {args.out / 'manifests'}")
    points = [(c.devices, c.worst, c.chosen) for c in found.candidates]
    try:
        picture.plan(points, settings.target, args.out / "plan.png",
                     title=f"snooze whatif plan: {args.trace.name}")  # fmt: skip
        print(f"wrote {args.out / 'plan.png'}")
    except picture.PlotError as exc:
        print(f"snooze whatif: {exc}", file=sys.stderr)
    line = json.dumps(
        {
            "plan": {
                "devices": found.devices,
                "models": models,
                "target_p99_s": settings.target,
                "worst_p99_s": round(found.worst, 3),
                "pools": pools,
                "alone": alone,
                "replays": found.replays,
                "search_seconds": round(found.seconds, 1),
                "candidates": [
                    {"devices": c.devices, "worst_p99_s": round(c.worst, 3)}
                    for c in found.candidates
                ],
                "result": fleet.as_json(),
            }
        }
    )
    (args.out / "plan.json").write_text(line + "\n", encoding="utf-8")
    print(line)
