"""`snooze gateway`: serve the OpenAI-compatible front door against the current kubeconfig."""

from __future__ import annotations

import argparse
import logging
import math

from snooze.api.durations import duration_flag, format_duration
from snooze.gateway.settings import GatewaySettings
from snooze.kube.flags import add_credential_arguments

_DEFAULTS = GatewaySettings()
# Flags that take a positive number, or a duration where the metavar says so: (flag, settings
# field, metavar, help).
_BOUNDS = (
    ("--max-held-per-model", "max_held_per_model", "N",
     "requests held per model while it wakes; more get 429"),
    ("--max-body-bytes", "max_body_bytes", "BYTES",
     "largest request body accepted, decompressed; larger gets 413"),
    ("--max-buffered-body-bytes", "max_buffered_body_bytes", "BYTES",
     "request body bytes held at once over all requests (held for a wake, being read or "
     "sent); over it, 503 with Retry-After"),
    ("--keepalive-seconds", "keepalive_seconds", "DURATION",
     "interval of SSE comments to held streaming requests"),
    ("--connect-timeout", "connect_timeout", "DURATION",
     "engine connect timeout before another pod is tried"),
    ("--upstream-first-byte-timeout", "upstream_first_byte_timeout", "DURATION",
     "how long an engine may take to start its answer (head and first chunk; a non-streamed "
     "answer comes after the whole generation); then 504"),
    ("--upstream-idle-timeout", "upstream_idle_timeout", "DURATION",
     "how long an engine may pause between two chunks of an answer; then 504, or a final "
     "SSE error event"),
    ("--upstream-start-timeout", "upstream_start_timeout", "DURATION",
     "how long an engine with requests waiting may start no answer (no stream's first "
     "event, no whole answer); then they get 502 and it gets no requests for a while. Above "
     "one long prompt's prefill alone: 128k tokens on a 70B model is about a minute on four "
     "A100s"),
    ("--client-read-timeout", "client_read_timeout", "DURATION",
     "how long a client may take none of its answer; then it is cut and its request ends "
     "(its model may sleep, its pool make room); well under the models' wake timeouts"),
    ("--client-header-timeout", "client_header_timeout", "DURATION",
     "how long a client may take to send a request's line and headers; then 408"),
    ("--client-body-timeout", "client_body_timeout", "DURATION",
     "how long a client may take to send a whole request body; then 408"),
    ("--wake-request-timeout", "wake_request_timeout", "DURATION",
     "how long writing a wake request to the Kubernetes API may take; then 503"),
    ("--shutdown-grace-seconds", "shutdown_grace_seconds", "DURATION",
     "on SIGTERM, how long streams and held requests may take to finish"),
)  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_credential_arguments(parser)
    parser.add_argument("--port", type=int, default=8080, help="port to listen on (default: 8080)")
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default: 0.0.0.0)")
    parser.add_argument(
        "--namespace",
        action="append",
        default=[],
        metavar="NS",
        help="serve only models in this namespace (repeatable); default: all namespaces",
    )
    for flag, field, metavar, text in _BOUNDS:
        default = getattr(_DEFAULTS, field)
        duration = metavar == "DURATION"
        parser.add_argument(
            flag,
            type=duration_flag() if duration else type(default),
            default=default,
            metavar=metavar,
            help=f"{text} (default: {format_duration(default) if duration else default})",
        )
    parser.add_argument(
        "--expose-model-status",
        action="store_true",
        help="add each model's phase, pod counts and namespace to /v1/models (off: model "
        "names only, for anonymous clients)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve Prometheus metrics at http://0.0.0.0:PORT/metrics",
    )


def settings_from(args: argparse.Namespace) -> GatewaySettings:
    """The settings the flags ask for; SystemExit naming the flag when one is not positive."""
    bounds = {}
    for flag, field, _, _ in _BOUNDS:
        value = getattr(args, field)
        if not (math.isfinite(value) and value > 0):
            raise SystemExit(
                f"snooze gateway: {flag} must be a finite number greater than zero (got {value})"
            )
        bounds[field] = value
    return GatewaySettings(
        host=args.host,
        port=args.port,
        namespaces=tuple(args.namespace),
        expose_model_status=args.expose_model_status,
        **bounds,
    )


def run(args: argparse.Namespace) -> int:
    import asyncio
    import signal

    from snooze.api.listening import CannotListen, exit_cannot_listen
    from snooze.gateway.metrics import GatewayMetrics
    from snooze.gateway.server import serve
    from snooze.kube import credentials
    from snooze.kube.api import KubeError

    settings = settings_from(args)
    credentials.use_or_exit("snooze gateway", args.kubeconfig, args.context)
    metrics = GatewayMetrics()
    if args.metrics_port is not None:
        from prometheus_client import ProcessCollector

        from snooze.gateway import metrics_port

        # The standard process_* series (CPU, memory, open files, start time), as every
        # Prometheus client exports them on its default registry.
        ProcessCollector(registry=metrics.registry)

        try:
            metrics_port.serve(args.metrics_port, metrics.registry, metrics.idle)
        except CannotListen as exc:
            return exit_cannot_listen("gateway", exc, what="metrics", port_flag="--metrics-port")

    async def main() -> None:
        # SIGTERM (a rollout, a node drain) and Ctrl-C drain the gateway; a second one stops
        # it at once.
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        server = asyncio.create_task(serve(settings, stop=stop, metrics=metrics))

        def on_signal(name: str) -> None:
            if stop.is_set():
                logging.getLogger(__name__).warning("%s again: stopping now", name)
                server.cancel()
            else:
                logging.getLogger(__name__).info(
                    "%s: draining for up to %gs", name, settings.shutdown_grace_seconds
                )
                stop.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal, sig.name)
        try:
            await server
        except asyncio.CancelledError:
            if not stop.is_set():
                raise

    try:
        asyncio.run(main())
    except KubeError as exc:  # no credentials, or an API that refuses the first list
        raise SystemExit(f"snooze gateway: {exc}") from None
    except CannotListen as exc:
        return exit_cannot_listen(
            "gateway", exc, what="its API", port_flag="--port", host_flag="--host"
        )
    return 0
