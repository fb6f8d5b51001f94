"""`snooze operator`: run the operator against the current kubeconfig or in-cluster config."""

from __future__ import annotations

import argparse
import math
import urllib.parse
from typing import TYPE_CHECKING

from snooze.api.durations import duration_flag
from snooze.kube.flags import add_credential_arguments

if TYPE_CHECKING:
    from snooze.operator.settings import Settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_credential_arguments(parser)
    parser.add_argument(
        "--namespace",
        action="append",
        default=[],
        metavar="NS",
        help="watch only this namespace (repeatable); default: all namespaces",
    )
    parser.add_argument(
        "--probe-interval",
        type=duration_flag(),
        default=10.0,
        metavar="DURATION",
        help="the longest an engine goes unobserved while a decision could depend on it: "
        "near its idle deadline, serving traffic that bypasses the gateway, or with a step "
        "to confirm: seconds, or a duration such as 10s or 1m (default: 10s)",
    )
    parser.add_argument(
        "--drain-timeout",
        type=duration_flag(),
        default=60.0,
        metavar="DURATION",
        help="longest wait for in-flight requests before sleeping (default: 60s)",
    )
    parser.add_argument(
        "--gateway-service",
        metavar="NAMESPACE/NAME",
        default=None,
        help="the gateway's metrics Service: its replicas' per-engine counters (found from its "
        "EndpointSlices) tell which engines serve requests, so that those are probed only near "
        "their idle deadline (the chart sets it)",
    )
    parser.add_argument(
        "--gateway-metrics",
        metavar="URL",
        action="append",
        default=[],
        help="a gateway replica's metrics URL, as --gateway-service finds them (repeatable)",
    )
    parser.add_argument(
        "--inference-gateway",
        action="store_true",
        help="read the endpoint pickers of the Gateway API Inference Extension's InferencePools "
        "that select models' pods: a request queued there wakes its model, as one held at the "
        "gateway does (needs read access to inferencepools, services and endpointslices)",
    )
    parser.add_argument(
        "--picker-interval",
        type=duration_flag(),
        default=2.0,
        metavar="DURATION",
        help="with --inference-gateway: how often each picker's queue is read (default: 2s)",
    )
    parser.add_argument(
        "--picker-token-file",
        metavar="FILE",
        default=None,
        help="with --inference-gateway: a file holding the bearer token for the pickers' "
        "metrics (a ServiceAccount token allowed to get the non-resource URL /metrics; the "
        "chart mounts one); default: none is sent",
    )
    parser.add_argument(
        "--drift-interval",
        type=duration_flag(),
        default=60.0,
        metavar="DURATION",
        help="the longest an engine goes unprobed when nothing depends on it: asleep, or "
        "known active from the gateway (default: 1m)",
    )
    parser.add_argument(
        "--status-interval",
        type=duration_flag(),
        default=600.0,
        metavar="DURATION",
        help="write a model's status at most this often when only its activity times moved; "
        "phases, counts and conditions are written at once; a restarted operator counts "
        "activity as up to this much newer than the status says (default: 10m)",
    )
    parser.add_argument(
        "--write-budget",
        type=float,
        default=2.0,
        metavar="N",
        help="each namespace's budget of API writes: N per probe interval (at most 10s) for "
        "each of its models (12 a minute at the default interval), in bursts of 30 intervals' "
        "worth; a wake's writes go first and may run one burst into debt; namespaces take "
        "turns; 0: no budget (default: 2)",
    )
    parser.add_argument(
        "--liveness-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve the liveness probe at http://0.0.0.0:PORT/healthz: 200 while the operator's "
        "event loop answers",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve Prometheus metrics at http://0.0.0.0:PORT/metrics",
    )
    parser.add_argument(
        "--peering",
        default=None,
        metavar="NAME",
        help="run with kopf peering under this name, so that of several replicas only one "
        "acts (needs kopf's peering CRDs); default: standalone",
    )
    parser.add_argument(
        "--priority",
        type=int,
        default=None,
        metavar="N",
        help="peering priority: the live replica with the highest acts, the others stand by "
        "(default with --peering: random, so that replicas never tie)",
    )
    parser.add_argument(
        "--peering-lifetime",
        type=duration_flag(),
        default=60,
        metavar="DURATION",
        help="with --peering: how long a replica's keep-alive counts, so how soon a standby "
        "takes over from a replica that died (default: 1m; kopf renews it 5 to 10 s before "
        "it expires, or every second when it is shorter)",
    )


def run(args: argparse.Namespace) -> int:
    import asyncio
    import random

    from snooze.api.listening import CannotListen, exit_cannot_listen
    from snooze.kube import credentials
    from snooze.operator.runner import serve
    from snooze.operator.runtime import Runtime

    settings = settings_from(args)
    credentials.use_or_exit("snooze operator", args.kubeconfig, args.context)
    # kopf pauses every replica that sees a live peer of the same priority: equal priorities
    # would leave the cluster unserved, so each replica draws its own.
    priority = args.priority
    if args.peering is not None and priority is None:
        priority = random.randint(1, 2**31 - 1)
    runtime = Runtime(settings=settings, namespaces=tuple(args.namespace or ()))
    if args.metrics_port is not None:
        from prometheus_client import ProcessCollector, make_wsgi_app

        from snooze.metricsport import server

        # The standard process_* series (CPU, memory, open files, start time), as every
        # Prometheus client exports them on its default registry.
        ProcessCollector(registry=runtime.metrics.registry)
        page = make_wsgi_app(runtime.metrics.registry)
        try:
            server.serve(args.metrics_port, page, name="metrics port")
        except CannotListen as exc:
            return exit_cannot_listen("operator", exc, what="metrics", port_flag="--metrics-port")
    with asyncio.Runner() as runner:
        if args.liveness_port:
            from snooze.operator import liveness

            try:
                liveness.serve(args.liveness_port, runner.get_loop())
            except CannotListen as exc:
                # --liveness-port 0 turns the port off: it picks no free one.
                return exit_cannot_listen(
                    "operator",
                    exc,
                    what="the liveness probe",
                    port_flag="--liveness-port",
                    zero_picks=False,
                )
        runner.run(
            serve(
                runtime,
                clusterwide=not args.namespace,
                namespaces=args.namespace,
                standalone=args.peering is None,
                peering_name=args.peering,
                priority=priority,
            )
        )
    return 0


def settings_from(args: argparse.Namespace) -> Settings:
    """The operator's settings from its flags; SystemExit naming the flag that is wrong."""
    from snooze.operator.settings import Settings

    if args.gateway_service is not None and args.gateway_service.count("/") != 1:
        raise SystemExit(
            "snooze operator: --gateway-service is NAMESPACE/NAME, such as "
            "snooze/snooze-gateway-metrics"
        )
    for url in args.gateway_metrics or ():
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise SystemExit(
                f"snooze operator: --gateway-metrics {url!r} is not an http(s) URL; give a"
                " gateway replica's metrics URL, such as http://10.0.0.7:9091/metrics"
            )
    if args.picker_token_file is not None and not args.inference_gateway:
        raise SystemExit(
            "snooze operator: --picker-token-file is for the pickers that --inference-gateway "
            "reads: give both, or neither"
        )
    if not math.isfinite(args.write_budget) or args.write_budget < 0:
        raise SystemExit(
            f"snooze operator: --write-budget {args.write_budget:g} is not a budget: give the "
            "writes per probe interval for each model, such as 2, or 0 for no budget"
        )
    if args.peering_lifetime < 2:
        raise SystemExit("snooze operator: --peering-lifetime must be at least 2 seconds")
    # kopf counts a peer's lifetime in whole seconds.
    peering_lifetime = math.ceil(args.peering_lifetime)
    return Settings(
        probe_interval=args.probe_interval,
        drain_timeout=args.drain_timeout,
        peering_lifetime=peering_lifetime,
        status_interval=args.status_interval,
        drift_interval=args.drift_interval,
        write_budget=args.write_budget,
        crd_poll_interval=min(5.0, args.probe_interval),
        gateway_service=args.gateway_service,
        gateway_metrics=tuple(args.gateway_metrics or ()),
        inference_gateway=args.inference_gateway,
        picker_interval=args.picker_interval,
        picker_token_file=args.picker_token_file,
    )
