"""`snooze check`: the cluster (CRDs, the operator, its leader and permissions, every model and
pool), or with --engine the engines themselves; one line per check, exit 0 when none failed."""

from __future__ import annotations

import argparse
import sys
import urllib.parse
from typing import TYPE_CHECKING

from snooze.api.durations import duration_flag
from snooze.kube.flags import add_credential_arguments

if TYPE_CHECKING:
    from snooze.check.report import Result
    from snooze.check.vllmjudge import PodSeen
    from snooze.kube.credentials import Source


class UsageError(Exception):
    """Flags that do not go together: one line, exit status 2."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        "Without --engine it checks the cluster of the kubeconfig (or the pod's service "
        "account). Exit status: 0 when no check failed (warnings allowed), 1 when one did, "
        "2 for bad flags. What each check means: docs/check.md."
    )
    engine = parser.add_argument_group("engines")
    engine.add_argument(
        "--engine",
        action="append",
        default=[],
        metavar="URL",
        help="check the engine at this URL (repeatable) instead of the cluster, vLLM or "
        "SGLang: its release, what Snooze needs of its flags, known bugs, weight checker and "
        "metrics",
    )
    engine.add_argument(
        "--pod",
        action="append",
        default=[],
        metavar="NAMESPACE/NAME",
        help="the pod of the --engine at the same place (repeatable, one per --engine), read "
        "through the API: its vllm serve arguments decide which known bugs apply (SGLang: its "
        "snooze.dev/released annotation, before a --cycle)",
    )
    engine.add_argument(
        "--cycle",
        action="store_true",
        help="put each engine to sleep and wake it once (SGLang: release and resume), timed, "
        "and check its answers and weights after the wake as the operator does; refused while "
        "it serves requests",
    )
    engine.add_argument(
        "--force",
        action="store_true",
        help="with --cycle: cycle an engine that is serving requests",
    )
    engine.add_argument(
        "--level",
        type=int,
        choices=(1, 2),
        default=None,
        help="with --cycle: the sleep level (default: 1 for vLLM; an SGLang server sleeps at "
        "the level its flags make)",
    )
    engine.add_argument(
        "--model",
        metavar="NAME",
        default=None,
        help="with --cycle: the model name for the output check (default: the first "
        "/v1/models lists)",
    )
    engine.add_argument(
        "--timeout",
        type=duration_flag(),
        default=10.0,
        metavar="DURATION",
        help="the most each request may take (default: 10s)",
    )
    engine.add_argument(
        "--cycle-timeout",
        type=duration_flag(),
        default=300.0,
        metavar="DURATION",
        help="with --cycle: the most the sleep, and then the wake, may take (default: 5m)",
    )
    cluster = parser.add_argument_group("cluster")
    add_credential_arguments(cluster)
    cluster.add_argument(
        "--namespace",
        action="append",
        default=[],
        metavar="NS",
        help="check only the InferenceModels and GPUPools of this namespace (repeatable; "
        "default: every namespace)",
    )
    cluster.add_argument(
        "--operator",
        metavar="NAMESPACE/NAME",
        default=None,
        help="the operator's Deployment (default: found by the chart's labels)",
    )
    parser.add_argument(
        "--output",
        choices=("text", "json"),
        default="text",
        help="text (default): one line per check; json: one document for scripts "
        "(docs/check.md describes it)",
    )


def run(args: argparse.Namespace) -> int:
    import asyncio

    from snooze.check import report

    try:
        validate(args)
    except UsageError as exc:
        print(f"snooze check: {exc}", file=sys.stderr)
        return 2
    source = None
    if args.pod or not args.engine:
        from snooze.kube import credentials

        source = credentials.use_or_exit("snooze check", args.kubeconfig, args.context)
    results = asyncio.run(_checks(args, source))
    sys.stdout.write(report.json_text(results) if args.output == "json" else report.text(results))
    return report.exit_code(results)


def validate(args: argparse.Namespace) -> None:
    """Flags that argparse cannot judge alone; UsageError names the one to fix."""
    for url in args.engine:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UsageError(
                f"--engine {url!r} is not an http(s) URL; give the engine's address and port, "
                "such as http://127.0.0.1:8000"
            )
    if args.pod and len(args.pod) != len(args.engine):
        raise UsageError(
            f"{len(args.pod)} --pod for {len(args.engine)} --engine: give one --pod for each "
            "--engine, in the same order, or none"
        )
    for pod in args.pod:
        namespace, _, name = pod.partition("/")
        if not namespace or not name or "/" in name:
            raise UsageError(f"--pod {pod!r} is not NAMESPACE/NAME, such as default/qwen3-8b-0")
    engine_only = {
        "--cycle": args.cycle,
        "--force": args.force,
        "--model": args.model is not None,
        "--level": args.level is not None,
    }
    if not args.engine:
        given = [flag for flag, on in engine_only.items() if on]
        if given:
            raise UsageError(f"{given[0]} needs --engine URL: it acts on an engine")
    elif not args.cycle:
        given = [flag for flag in ("--force", "--model", "--level") if engine_only[flag]]
        if given:
            raise UsageError(f"{given[0]} goes with --cycle")
    if args.engine and (args.namespace or args.operator):
        flag = "--namespace" if args.namespace else "--operator"
        raise UsageError(f"{flag} is for the cluster's checks, which --engine leaves out")
    if args.operator is not None:
        namespace, _, name = args.operator.partition("/")
        if not namespace or not name or "/" in name:
            raise UsageError(
                f"--operator {args.operator!r} is not NAMESPACE/NAME, such as "
                "snooze/snooze-operator"
            )


async def _checks(args: argparse.Namespace, source: Source | None) -> list[Result]:
    if not args.engine:
        from snooze.check import cluster

        assert source is not None
        return await cluster.check_cluster(
            source, namespaces=tuple(args.namespace), operator=args.operator
        )
    from snooze.check.cycle import CycleOptions
    from snooze.check.engines import EngineOptions, check_engines

    cycle = (
        CycleOptions(
            level=args.level, timeout=args.cycle_timeout, force=args.force, model=args.model
        )
        if args.cycle
        else None
    )
    options = EngineOptions(timeout=args.timeout, cycle=cycle)
    pods: list[PodSeen | None] = [None] * len(args.engine)
    if args.pod:
        assert source is not None
        pods = list(await _read_pods(source, args.pod, args.timeout))
    return await check_engines([u.rstrip("/") for u in args.engine], pods, options)


async def _read_pods(source: Source, names: list[str], seconds: float) -> list[PodSeen | None]:
    """The pods --pod names, read through the API (each one's failure kept for its line)."""
    import asyncio

    from snooze.check.vllmjudge import PodSeen
    from snooze.kube.api import KubeApi, KubeError, pods_ref
    from snooze.kube.pods import pod_info

    api = KubeApi(source, timeout=seconds)

    async def read(text: str) -> PodSeen | None:
        namespace, _, name = text.partition("/")
        try:
            async with asyncio.timeout(seconds * 3):
                body = await api.get(pods_ref(namespace), name)
        except (KubeError, TimeoutError) as exc:
            why = str(exc) or f"no answer within {seconds * 3:g}s"
            return PodSeen(namespace=namespace, name=name, failure=why)
        released = pod_info(body).released is not None
        spec = body.get("spec") or {}
        return PodSeen(namespace=namespace, name=name, spec=spec, released=released)

    try:
        return list(await asyncio.gather(*(read(text) for text in names)))
    finally:
        await api.aclose()
