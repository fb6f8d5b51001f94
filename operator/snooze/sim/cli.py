"""`snooze sim`: serve simulated vLLM engines on consecutive loopback addresses."""

from __future__ import annotations

import argparse
import ipaddress

from snooze.sim.engine import EngineConfig

# Argparse defaults come from EngineConfig, so the CLI and the Python API cannot disagree.
_DEFAULTS = EngineConfig()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The subcommand's flags; imports nothing heavy so that `snooze --help` stays fast."""
    add = parser.add_argument
    add("--host", default="127.0.0.1", help="address of the first engine (default: %(default)s)")
    add("--port", type=int, default=8000, help="port of every engine (default: %(default)s)")
    add("--model", default=_DEFAULTS.model, help="served model name (default: %(default)s)")
    add(
        "--count",
        type=int,
        default=1,
        help="serve N engines on consecutive addresses from --host (default: %(default)s)",
    )
    add(
        "--sleep-seconds",
        type=float,
        default=_DEFAULTS.sleep_seconds,
        help="duration of a level-1/2 sleep (default: %(default)s)",
    )
    add(
        "--wake-seconds",
        type=float,
        default=_DEFAULTS.wake_seconds,
        help="time to bring the weights back on wake (default: %(default)s)",
    )
    add(
        "--kv-wake-seconds",
        type=float,
        default=_DEFAULTS.kv_wake_seconds,
        help="time to re-allocate the KV cache on wake (default: %(default)s)",
    )
    add(
        "--reload-seconds",
        type=float,
        default=_DEFAULTS.reload_seconds,
        help="duration of collective_rpc reload_weights (default: %(default)s)",
    )
    add(
        "--token-seconds",
        type=float,
        default=_DEFAULTS.token_seconds,
        help="pacing between generated tokens (default: %(default)s)",
    )
    add(
        "--max-tokens-default",
        type=int,
        default=_DEFAULTS.max_tokens_default,
        help="tokens generated when a request sets no max_tokens (default: %(default)s)",
    )
    add(
        "--max-concurrency",
        type=int,
        default=_DEFAULTS.max_concurrency,
        help="running requests per engine; more count as waiting (default: %(default)s)",
    )
    add(
        "--gpu-memory-gib",
        type=float,
        default=_DEFAULTS.gpu_memory_gib,
        help="simulated weights on the GPU (default: %(default)s)",
    )
    add(
        "--kv-cache-gib",
        type=float,
        default=_DEFAULTS.kv_cache_gib,
        help="simulated KV cache on the GPU (default: %(default)s)",
    )
    add(
        "--max-model-len",
        type=int,
        default=_DEFAULTS.max_model_len,
        help="reported by /v1/models (default: %(default)s)",
    )
    add(
        "--startup-seconds",
        type=float,
        default=_DEFAULTS.startup_seconds,
        help="loading time before listening, as vLLM (default: %(default)s)",
    )
    add(
        "--no-dev-mode",
        action="store_true",
        help="no admin endpoints (/sleep, /wake_up...): like VLLM_SERVER_DEV_MODE unset",
    )
    add(
        "--hybrid-wake-crash",
        action="store_true",
        help="reproduce vLLM issue #41564: waking the KV cache fails with HTTP 500",
    )
    add(
        "--full-metrics",
        action="store_true",
        help="emit a full-size vLLM /metrics payload (histograms), for scrape benchmarks",
    )


def configs_from(args: argparse.Namespace) -> list[EngineConfig]:
    """One config per engine, on consecutive addresses."""
    first = ipaddress.ip_address(args.host)
    return [
        EngineConfig(
            model=args.model,
            host=str(first + i),
            port=args.port,
            sleep_seconds=args.sleep_seconds,
            wake_seconds=args.wake_seconds,
            kv_wake_seconds=args.kv_wake_seconds,
            reload_seconds=args.reload_seconds,
            token_seconds=args.token_seconds,
            max_tokens_default=args.max_tokens_default,
            max_concurrency=args.max_concurrency,
            gpu_memory_gib=args.gpu_memory_gib,
            kv_cache_gib=args.kv_cache_gib,
            max_model_len=args.max_model_len,
            startup_seconds=args.startup_seconds,
            dev_mode=not args.no_dev_mode,
            hybrid_wake_crash=args.hybrid_wake_crash,
            full_metrics=args.full_metrics,
        )
        for i in range(args.count)
    ]


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted."""
    import asyncio
    import contextlib
    import logging

    from snooze.sim.host import serve_engines

    configs = configs_from(args)

    async def main() -> None:
        async with serve_engines(configs) as engines:
            last = engines[-1]
            logging.getLogger("snooze.sim").info(
                "serving %d engine(s) of %r from %s to %s",
                len(engines),
                args.model,
                engines[0].url,
                last.url,
            )
            await asyncio.Event().wait()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
    return 0
