"""`snooze sim`: serve simulated vLLM engines (or SGLang servers) on consecutive loopback
addresses."""

from __future__ import annotations

import argparse
import ipaddress
import itertools
import sys
from collections.abc import Callable
from pathlib import Path

from snooze.api.durations import duration_flag
from snooze.sim.contract import unread
from snooze.sim.device import SimulatedDevice
from snooze.sim.devicefile import DeviceFile, DeviceFileError
from snooze.sim.engine import EngineConfig
from snooze.sim.sglang import cli as sglang_cli

# Argparse defaults come from EngineConfig, so the CLI and the Python API cannot disagree.
_DEFAULTS = EngineConfig()
SHARED_DEVICE = "gpu0"
"""The name of the device that --shared-gpu-gib makes (the `device` label of its metrics)."""


def _positive(kind: type[int] | type[float]) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = kind(text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be positive, not {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its "invalid ..." message
    return parse


def _share(text: str) -> float:
    value = float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 0 and below 1, not {text}")
    return value


_share.__name__ = "share"


def _release(text: str) -> str:
    from snooze.sim.contract import parse_release

    try:
        parse_release(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


_release.__name__ = "release"


def _address(text: str) -> str:
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an IP address: {text!r}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The subcommand's flags; imports nothing heavy so that `snooze --help` stays fast."""
    add = parser.add_argument
    add(
        "--host",
        type=_address,
        default="127.0.0.1",
        help="IP address of the first engine (default: %(default)s)",
    )
    add("--port", type=int, default=8000, help="port of every engine (default: %(default)s)")
    add(
        "--model",
        action="append",
        metavar="NAME",
        help="served model name; repeat it for several: engine i serves the i-th name, cycling"
        f" (default: {_DEFAULTS.model})",
    )
    add(
        "--count",
        type=_positive(int),
        default=1,
        help="serve N engines on consecutive addresses from --host (default: %(default)s)",
    )
    add(
        "--shared-gpu-gib",
        type=_positive(float),
        metavar="G",
        help="put every engine on one simulated GPU of G GiB, as several vLLM pods share one"
        " (DRA, time-slicing): an engine starts only when its footprint is free (weights + KV"
        " cache + what sleep keeps), and a wake without room fails with vLLM's out-of-memory"
        " error. Default: each engine has a GPU of its own",
    )
    add(
        "--sleep-seconds",
        type=duration_flag(zero=True),
        metavar="DURATION",
        default=_DEFAULTS.sleep_seconds,
        help="duration of an engine's first level-1 sleep, which pins host RAM and copies the"
        " weights there (default: %(default)ss)",
    )
    add(
        "--pinning-share",
        type=_share,
        default=_DEFAULTS.pinning_share,
        help="the part of that first sleep spent pinning host RAM, which later level-1 sleeps"
        " skip: the pinned blocks are kept after the wake and reused (default: %(default)s)",
    )
    add(
        "--level2-sleep-seconds",
        type=duration_flag(zero=True),
        metavar="DURATION",
        default=_DEFAULTS.level2_sleep_seconds,
        help="duration of a level-2 sleep, which discards them (default: %(default)ss)",
    )
    add(
        "--wake-seconds",
        type=duration_flag(zero=True),
        metavar="DURATION",
        default=_DEFAULTS.wake_seconds,
        help="time to bring the weights back on wake (default: %(default)ss)",
    )
    add(
        "--kv-wake-seconds",
        type=duration_flag(zero=True),
        metavar="DURATION",
        default=_DEFAULTS.kv_wake_seconds,
        help="time to re-allocate the KV cache on wake (default: %(default)ss)",
    )
    add(
        "--reload-seconds",
        type=duration_flag(zero=True),
        metavar="DURATION",
        default=_DEFAULTS.reload_seconds,
        help="duration of collective_rpc reload_weights (default: %(default)ss)",
    )
    add(
        "--token-seconds",
        type=duration_flag(zero=True),
        metavar="DURATION",
        default=_DEFAULTS.token_seconds,
        help="pacing between generated tokens (default: %(default)ss)",
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
        "--asleep-memory-gib",
        type=float,
        default=_DEFAULTS.asleep_memory_gib,
        help="GPU memory a sleeping engine still holds: CUDA context and graphs (default:"
        " %(default)s)",
    )
    add(
        "--start-retry-seconds",
        type=duration_flag(),
        metavar="DURATION",
        default=_DEFAULTS.start_retry_seconds,
        help="while its GPU lacks room, an engine answers 503 and retries this often, like a"
        " restarting container (default: %(default)ss)",
    )
    add(
        "--max-model-len",
        type=int,
        default=_DEFAULTS.max_model_len,
        help="reported by /v1/models (default: %(default)s)",
    )
    add(
        "--startup-seconds",
        type=duration_flag(zero=True),
        metavar="DURATION",
        default=_DEFAULTS.startup_seconds,
        help="loading time before listening, as vLLM (default: %(default)ss)",
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
        "--sleep-frees-nothing",
        action="store_true",
        help="an engine that lies: it answers /sleep and reports sleeping, but keeps its GPU"
        " memory (for testing how a GPU pool finds such a member out)",
    )
    add(
        "--shared-gpu-file",
        metavar="FILE",
        help="keep that GPU's books in FILE, so that the engines of several `snooze sim`"
        " processes share it, as the pods of one node share a device (mount one hostPath in"
        " each); what a process held comes back when it ends. Needs --shared-gpu-gib",
    )
    add(
        "--full-metrics",
        action="store_true",
        help="emit a full-size vLLM /metrics payload (histograms), for scrape benchmarks",
    )
    add(
        "--vllm-version",
        type=_release,
        default=_DEFAULTS.vllm_version,
        metavar="X.Y.Z",
        help="the vLLM release (0.8.0 or later) whose HTTP contract to speak: which routes"
        " exist, what /sleep, /wake_up and /pause take and answer, which /metrics path"
        " filters, its error bodies and its sleep-state metrics, as docs/vllm-contract.md"
        " says (default: %(default)s)",
    )
    add(
        "--tensor-parallel-size",
        type=_positive(int),
        default=_DEFAULTS.tensor_parallel_size,
        help="ranks per layer: a weight digest each; before vLLM 0.25.0 a /sleep with requests"
        " in flight kills a parallel engine, as vllm#45520 (default: %(default)s)",
    )
    add(
        "--pipeline-parallel-size",
        type=_positive(int),
        default=_DEFAULTS.pipeline_parallel_size,
        help="pipeline stages, likewise (default: %(default)s)",
    )
    add(
        "--num-layers",
        type=_positive(int),
        default=_DEFAULTS.num_layers,
        help="the model's decoder layers: /weight_checker answers six weight tensors a layer on"
        " every rank (32: a Llama-3-8B's; 80: a 70B's) (default: %(default)s)",
    )
    add(
        "--wake-corrupts-weights",
        action="store_true",
        help="from the first wake on, a weight tensor comes back wrong: /weight_checker's"
        " digests differ, a short greedy answer does not show it (add --wake-changes-output"
        " for answers that differ too)",
    )
    add(
        "--wake-changes-output",
        action="store_true",
        help="from the first wake on, the answers differ while the weights' digests do not"
        " (as the LoRA state lost by vllm#53888)",
    )
    add(
        "--nondeterministic",
        action="store_true",
        help="greedy answers differ from one request to the next",
    )
    add(
        "--checksum-seconds-per-gib",
        type=float,
        default=_DEFAULTS.checksum_seconds_per_gib,
        help="time /weight_checker takes per GiB of weights on one rank (default: %(default)s)",
    )
    sglang_cli.add_arguments(parser)


def devices_from(args: argparse.Namespace) -> list[SimulatedDevice]:
    """The shared GPU, if asked for (its books in a file with --shared-gpu-file)."""
    if args.shared_gpu_gib is None:
        if args.shared_gpu_file:
            raise DeviceFileError("--shared-gpu-file needs --shared-gpu-gib: give the GPU's size")
        return []
    if args.shared_gpu_file:
        path = Path(args.shared_gpu_file)
        return [DeviceFile(name=SHARED_DEVICE, memory_gib=args.shared_gpu_gib, path=path)]
    return [SimulatedDevice(name=SHARED_DEVICE, memory_gib=args.shared_gpu_gib)]


def configs_from(args: argparse.Namespace) -> list[EngineConfig]:
    """One config per engine, on consecutive addresses, the models taken in turn."""
    first = ipaddress.ip_address(args.host)
    models = itertools.cycle(args.model or [_DEFAULTS.model])
    configs = [
        EngineConfig(
            model=next(models),
            host=str(first + i),
            port=args.port,
            sleep_seconds=args.sleep_seconds,
            pinning_share=args.pinning_share,
            level2_sleep_seconds=args.level2_sleep_seconds,
            wake_seconds=args.wake_seconds,
            kv_wake_seconds=args.kv_wake_seconds,
            reload_seconds=args.reload_seconds,
            token_seconds=args.token_seconds,
            max_tokens_default=args.max_tokens_default,
            max_concurrency=args.max_concurrency,
            gpu_memory_gib=args.gpu_memory_gib,
            kv_cache_gib=args.kv_cache_gib,
            asleep_memory_gib=args.asleep_memory_gib,
            device=SHARED_DEVICE if args.shared_gpu_gib is not None else None,
            start_retry_seconds=args.start_retry_seconds,
            max_model_len=args.max_model_len,
            startup_seconds=args.startup_seconds,
            dev_mode=not args.no_dev_mode,
            hybrid_wake_crash=args.hybrid_wake_crash,
            frees_nothing=args.sleep_frees_nothing,
            full_metrics=args.full_metrics,
            vllm_version=args.vllm_version,
            tensor_parallel_size=args.tensor_parallel_size,
            num_layers=args.num_layers,
            pipeline_parallel_size=args.pipeline_parallel_size,
            wake_corrupts_weights=args.wake_corrupts_weights,
            wake_changes_output=args.wake_changes_output,
            nondeterministic=args.nondeterministic,
            checksum_seconds_per_gib=args.checksum_seconds_per_gib,
        )
        for i in range(args.count)
    ]
    return sglang_cli.sglang_configs(args, configs)


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted; a bad address or size is one line on stderr and exit code 2."""
    import asyncio
    import contextlib
    import logging

    from snooze.api.listening import exit_cannot_listen
    from snooze.sim.host import AddressUnavailable, EngineDoesNotFit, serve_engines

    configs = configs_from(args)
    for said in sorted({s for c in configs if (s := unread(c.vllm_version)) is not None}):
        logging.getLogger("snooze.sim").warning("%s", said)
    try:
        devices = devices_from(args)
    except DeviceFileError as exc:
        print(f"snooze sim: {exc}", file=sys.stderr)
        return 2

    async def main() -> None:
        import signal

        # SIGTERM (a container's stop, a test's terminate) ends it as Ctrl-C does: the engines
        # close their connections and the process exits 0, not killed by the default handler.
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        async with serve_engines(configs, devices=devices) as engines:
            where = f"one {args.shared_gpu_gib} GiB GPU" if devices else "a GPU each"
            logging.getLogger("snooze.sim").info(
                "serving %d engine(s) of %s on %s, from %s to %s",
                len(engines),
                ", ".join(sorted({e.config.model for e in engines})),
                where,
                engines[0].url,
                engines[-1].url,
            )
            await stop.wait()

    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(main())
    except AddressUnavailable as exc:
        return exit_cannot_listen(
            "sim", exc, what="an engine", port_flag="--port", host_flag="--host"
        )
    except EngineDoesNotFit as exc:
        print(
            f"snooze sim: {exc}. Lower --gpu-memory-gib, --kv-cache-gib or --asleep-memory-gib,"
            " or raise --shared-gpu-gib.",
            file=sys.stderr,
        )
        return 2
    return 0
