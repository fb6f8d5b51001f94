"""`snooze gateway`: serve the OpenAI-compatible front door against the current kubeconfig."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="the kubeconfig to use (default: KUBECONFIG, else the pod's service account, "
        "else ~/.kube/config)",
    )
    parser.add_argument(
        "--context", metavar="NAME", help="the kubeconfig context to use (default: its current)"
    )
    parser.add_argument("--port", type=int, default=8080, help="port to listen on (default: 8080)")
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default: 0.0.0.0)")
    parser.add_argument(
        "--namespace",
        action="append",
        default=[],
        metavar="NS",
        help="serve only models in this namespace (repeatable); default: all namespaces",
    )
    parser.add_argument(
        "--max-held-per-model",
        type=int,
        default=256,
        metavar="N",
        help="requests held per model while it wakes; more get 429 (default: 256)",
    )
    parser.add_argument(
        "--max-body-bytes",
        type=int,
        default=10 * 1024 * 1024,
        metavar="BYTES",
        help="largest request body accepted; larger gets 413 (default: 10 MiB)",
    )
    parser.add_argument(
        "--keepalive-seconds",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="interval of SSE comments to held streaming requests (default: 5)",
    )
    parser.add_argument(
        "--connect-timeout",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="engine connect timeout before another pod is tried (default: 5)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve Prometheus metrics at http://0.0.0.0:PORT/metrics",
    )


def run(args: argparse.Namespace) -> int:
    import asyncio
    import contextlib

    from snooze.gateway.metrics import GatewayMetrics
    from snooze.gateway.server import serve
    from snooze.gateway.settings import GatewaySettings
    from snooze.kube import credentials

    for flag, value in (
        ("--max-held-per-model", args.max_held_per_model),
        ("--max-body-bytes", args.max_body_bytes),
        ("--keepalive-seconds", args.keepalive_seconds),
        ("--connect-timeout", args.connect_timeout),
    ):
        if value <= 0:
            raise SystemExit(f"snooze gateway: {flag} must be greater than zero")
    credentials.use_or_exit("snooze gateway", args.kubeconfig, args.context)
    settings = GatewaySettings(
        host=args.host,
        port=args.port,
        namespaces=tuple(args.namespace),
        max_held_per_model=args.max_held_per_model,
        max_body_bytes=args.max_body_bytes,
        keepalive_seconds=args.keepalive_seconds,
        connect_timeout=args.connect_timeout,
    )
    metrics = GatewayMetrics()
    if args.metrics_port is not None:
        from prometheus_client import ProcessCollector, start_http_server

        # The standard process_* series (CPU, memory, open files, start time), as every
        # Prometheus client exports them on its default registry.
        ProcessCollector(registry=metrics.registry)
        try:
            start_http_server(args.metrics_port, registry=metrics.registry)
        except OSError as exc:
            raise SystemExit(
                f"snooze gateway: cannot serve metrics on port {args.metrics_port}: {exc}"
            ) from None
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how a person stops it
        asyncio.run(serve(settings, metrics=metrics))
    return 0
