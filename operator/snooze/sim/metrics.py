"""The Prometheus text exposition of a simulated engine, with vLLM's metric names and labels."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass

from snooze.sim.device import KV_CACHE
from snooze.sim.engine import SimulatedEngine
from snooze.sim.histograms import Histogram, Sample

# The exposition format prometheus_client's ASGI app (vLLM's /metrics) answers with by default.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")


@dataclass
class Family:
    """One metric family as prometheus_client prints it."""

    name: str  # as in the HELP and TYPE lines (counters keep `_total` there)
    kind: str
    help: str
    samples: list[Sample]


def _histogram(name: str, help_: str, hist: Histogram, labels: str) -> Family:
    return Family(name, "histogram", help_, list(hist.samples(name, labels)))


def _one(name: str, kind: str, help_: str, labels: str, value: float) -> Family:
    return Family(name, kind, help_, [(name, labels, float(value))])


def families(engine: SimulatedEngine) -> list[Family]:
    """Every family the engine exposes; cheap enough to build on each scrape."""
    cfg = engine.config
    base = f'model_name="{cfg.model}",engine="0"'
    out = [
        _one(
            "vllm:num_requests_running",
            "gauge",
            "Number of requests in model execution batches.",
            base,
            engine.running,
        ),
        _one(
            "vllm:num_requests_waiting",
            "gauge",
            "Number of requests waiting to be processed.",
            base,
            engine.waiting,
        ),
        _one(
            "vllm:kv_cache_usage_perc",
            "gauge",
            "KV-cache usage. 1 means 100 percent usage.",
            base,
            engine.running / max(cfg.max_concurrency, 1) if engine.kv_on_gpu else 0.0,
        ),
        Family(
            "vllm:request_success_total",
            "counter",
            "Count of successfully processed requests.",
            [
                ("vllm:request_success_total", f'{base},finished_reason="{reason}"', float(n))
                for reason, n in sorted(engine.finished.items())
            ],
        ),
        _one(
            "vllm:prompt_tokens_total",
            "counter",
            "Number of prefill tokens processed.",
            base,
            engine.prompt_tokens,
        ),
        _one(
            "vllm:generation_tokens_total",
            "counter",
            "Number of generation tokens processed.",
            base,
            engine.generation_tokens,
        ),
        _one("vllm:cache_config_info", "gauge", CACHE_CONFIG_HELP, _cache_config(engine), 1),
    ]
    out.extend(_sleep_families(engine, base))
    if cfg.full_metrics:
        out.extend(_full(engine, base))
        if engine.contract.instrumentator:
            out.extend(_instrumentator(engine))
    return out + simulator_families(engine, base)


def _sleep_families(engine: SimulatedEngine, base: str) -> list[Family]:
    """The sleep state (vLLM 0.11.1+: every series 0 after a level-0 sleep or a released KV
    cache) and the timed sleep operations (0.32+: created at the first operation, each
    `operation` series at its own first use)."""
    contract = engine.contract
    out = []
    if contract.sleep_state_metric:
        state = engine.sleep_state
        samples = [
            ("vllm:engine_sleep_state", f'{base},sleep_state="{s}"', 1.0 if s == state else 0.0)
            for s in SLEEP_STATES
        ]
        out.append(
            Family(
                "vllm:engine_sleep_state",
                "gauge",
                "Engine sleep state; awake = 0 means asleep.",
                samples,
            )
        )
    if contract.sleep_operation_metrics and engine.ops_in_flight:
        out.append(
            Family(
                "vllm:sleep_mode_operations_in_flight",
                "gauge",
                "Sleep-mode operations currently awaited.",
                [
                    ("vllm:sleep_mode_operations_in_flight", f'operation="{op}"', float(n))
                    for op, n in engine.ops_in_flight.items()
                ],
            )
        )
        out.append(
            Family(
                "vllm:sleep_mode_operation_duration_seconds",
                "histogram",
                "Duration of one sleep-mode operation.",
                [
                    s
                    for op, h in engine.op_durations.items()
                    for s in h.samples(
                        "vllm:sleep_mode_operation_duration_seconds", f'operation="{op}"'
                    )
                ],
            )
        )
    return out


def simulator_families(engine: SimulatedEngine, base: str) -> list[Family]:
    """The simulator's own gauges, served even while the engine cannot start."""
    device = engine.device
    dev = f'device="{device.name}"'
    return [
        _one(
            "snooze_sim_gpu_memory_used_bytes",
            "gauge",
            "Simulator only: GPU memory this engine holds (what sleep keeps, while asleep).",
            base,
            engine.gpu_memory_bytes,
        ),
        _one(
            "snooze_sim_host_memory_used_bytes",
            "gauge",
            "Simulator only: pinned host RAM this engine holds (its weights' copy from a "
            "level-1 sleep, kept cached after the wake until the process ends).",
            base,
            engine.host_memory_bytes,
        ),
        Family(
            "snooze_sim_gpu_oom_total",
            "counter",
            "Simulator only: GPU allocations this engine was refused, by operation.",
            [
                ("snooze_sim_gpu_oom_total", f'{base},operation="{op}"', float(n))
                for op, n in engine.memory.oom_total.items()
            ],
        ),
        Family(
            "snooze_sim_gpu_device_memory_bytes",
            "gauge",
            "Simulator only: memory of the device this engine runs on, used and free.",
            [
                ("snooze_sim_gpu_device_memory_bytes", f'{dev},state="used"', device.used_bytes),
                ("snooze_sim_gpu_device_memory_bytes", f'{dev},state="free"', device.free_bytes),
            ],
        ),
        _one(
            "snooze_sim_gpu_device_oom_total",
            "counter",
            "Simulator only: GPU allocations the device refused, all its engines together.",
            dev,
            device.oom_total,
        ),
    ]


CACHE_CONFIG_HELP = "Information of the LLMEngine CacheConfig"
BLOCK_SIZE = 16  # what vLLM resolves `block_size` to on CUDA
KV_BYTES_PER_TOKEN = 128 * 1024
"""KV cache per token of a Llama-3-8B in bf16 (2 x 32 layers x 8 KV heads x 128 x 2 bytes): the
simulator's KV cache size in GiB becomes blocks and tokens as for that model."""


def _cache_config(engine: SimulatedEngine) -> str:
    """`vllm:cache_config_info`'s labels: vLLM 0.33 makes one per CacheConfig field, in the order
    of its declaration, each `str(value)` after start-up, then `engine` (vllm/config/cache.py,
    metrics_info; vllm/v1/metrics/loggers.py, log_metrics_info). Fields the simulator has no
    reason to change keep vLLM's defaults."""
    cfg = engine.config
    blocks = engine.memory.part_bytes[KV_CACHE] // (BLOCK_SIZE * KV_BYTES_PER_TOKEN)
    concurrency = blocks / -(-cfg.max_model_len // BLOCK_SIZE)
    fields: dict[str, object] = {
        "block_size": BLOCK_SIZE,
        "user_specified_block_size": False,
        "kv_cache_layout": None,
        "prefix_match_unit": None,
        "gpu_memory_utilization": engine.memory.utilization,
        "cache_dtype": "auto",
        "is_attention_free": False,
        "num_gpu_blocks_override": None,
        "sliding_window": None,
        "enable_prefix_caching": True,
        "prefix_caching_hash_algo": "sha256",
        "prefix_cache_retention_interval": 0,
        "kv_cache_dtype_skip_layers": [],
        "mamba_page_size_padded": None,
        "skip_page_size_padded": None,
        "mamba_block_size": None,
        "mamba_cache_dtype": "auto",
        "mamba_ssm_cache_dtype": "auto",
        "mamba_cache_mode": "none",
        "enable_mamba_shared_prefix_checkpoint": False,
        "replayssm_buffer_len": 16,
        "use_replayssm": False,
        "use_kda_recoverssm": False,
        "num_gpu_blocks": blocks,
        "num_cpu_blocks": None,
        "simple_cpu_offload_num_blocks": None,
        "effective_attention_block_size": BLOCK_SIZE,
        "kv_cache_size_tokens": int(concurrency * cfg.max_model_len),
        "kv_cache_max_concurrency": concurrency,
        "hash_block_size": None,
        "cache_hit_alignment_tokens": None,
        "kv_sharing_fast_prefill": False,
        "swa_bounded_replay": True,
        "kv_cache_memory_bytes": None,
        "kv_offloading_size": None,
        "kv_offloading_backend": "native",
        "_block_size_resolved": True,
        "engine": 0,
    }
    return ",".join(f'{name}="{value}"' for name, value in fields.items())


def _full(engine: SimulatedEngine, base: str) -> Iterator[Family]:
    """The large part of a real payload: histograms a scrape benchmark must pay for."""
    yield _one("vllm:num_preemptions_total", "counter", "Cumulative number of preemption.", base, 0)
    yield _one(
        "vllm:prefix_cache_queries_total",
        "counter",
        "Prefix cache queries, in tokens.",
        base,
        engine.prompt_tokens,
    )
    yield _one("vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in tokens.", base, 0)
    hists = engine.histograms
    for name, help_ in (
        ("time_to_first_token_seconds", "Histogram of time to first token in seconds."),
        ("inter_token_latency_seconds", "Histogram of inter-token latency in seconds."),
        ("e2e_request_latency_seconds", "Histogram of e2e request latency in seconds."),
        ("request_queue_time_seconds", "Histogram of time spent in WAITING phase for request."),
        ("request_inference_time_seconds", "Histogram of time spent in RUNNING phase."),
        ("request_prefill_time_seconds", "Histogram of time spent in PREFILL phase."),
        ("request_decode_time_seconds", "Histogram of time spent in DECODE phase."),
        ("request_prompt_tokens", "Number of prefill tokens processed."),
        ("request_generation_tokens", "Number of generation tokens processed."),
        ("request_params_max_tokens", "Histogram of the max_tokens request parameter."),
        ("iteration_tokens_total", "Histogram of number of tokens per engine_step."),
        ("request_params_n", "Histogram of the n request parameter."),
        ("request_max_num_generation_tokens", "Histogram of maximum number of requested tokens."),
        ("request_time_per_output_token_seconds", "Histogram of time per output token."),
        ("request_prefill_kv_computed_tokens", "Histogram of new KV tokens computed in prefill."),
        ("request_num_preemptions", "Histogram of the number of preemptions per request."),
    ):
        yield _histogram(f"vllm:{name}", help_, hists[name], base)


# prometheus-fastapi-instrumentator's default metrics (metrics.default()), which vLLM 0.8.5+
# adds to its page for every route but those it excludes (entrypoints/.../metrics.py).
EXCLUDED_HANDLERS = ("/metrics", "/health", "/load", "/ping", "/version", "/server_info")
HIGHR_BUCKETS: tuple[float, ...] = (0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5)
HIGHR_BUCKETS += (2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 7.5, 10.0, 30.0, 60.0)


def _instrumentator(engine: SimulatedEngine) -> Iterator[Family]:
    """The instrumentator's families, one series per route the engine was asked (the
    simulator does not time them: their counts are right, their values zero)."""
    routes = sorted(
        (key.split(" ", 1)[0], key.split(" ", 1)[1], n)
        for key, n in engine.seen.items()
        if key.split(" ", 1)[1].rstrip("/") not in EXCLUDED_HANDLERS
    )
    total = float(sum(n for _, _, n in routes))
    yield Family(
        "http_requests_total",
        "counter",
        "Total number of requests by method, status and handler.",
        [
            ("http_requests_total", f'handler="{p}",method="{m}",status="2xx"', float(n))
            for m, p, n in routes
        ],
    )
    for name, help_ in (
        ("http_request_size_bytes", "Content length of incoming requests by handler."),
        ("http_response_size_bytes", "Content length of outgoing responses by handler."),
    ):
        samples: list[Sample] = []
        for _, path, n in routes:
            samples += [(f"{name}_count", f'handler="{path}"', float(n))]
            samples += [(f"{name}_sum", f'handler="{path}"', 0.0)]
        yield Family(name, "summary", help_, samples)
    highr = Histogram(HIGHR_BUCKETS)
    highr.count, highr.counts[0] = int(total), int(total)
    yield _histogram(
        "http_request_duration_highr_seconds",
        "Latency with many buckets but no API specific labels.",
        highr,
        "",
    )
    durations: list[Sample] = []
    for method, path, n in routes:
        low = Histogram((0.1, 0.5, 1.0))
        low.count, low.counts[0] = n, n
        durations += low.samples(
            "http_request_duration_seconds", f'handler="{path}",method="{method}"'
        )
    yield Family(
        "http_request_duration_seconds",
        "histogram",
        "Latency with only few buckets by handler.",
        durations,
    )


def _value(value: float) -> str:
    # prometheus_client prints floats the Go way; repr matches it for the values used here.
    return repr(float(value))


def render(engine: SimulatedEngine, names: Collection[str] | None = None) -> str:
    """The text exposition; `names` filters like prometheus_client's `name[]`.

    prometheus_client keeps a family if any of its *sample* names is asked for, and only those
    samples: counters are asked for as `x_total`, histograms as `x_bucket`/`x_count`/`x_sum`.
    An engine that could not start yet has no vLLM metrics, only the simulator's.
    """
    base = f'model_name="{engine.config.model}",engine="0"'
    fams = families(engine) if engine.loaded else simulator_families(engine, base)
    if engine.config.full_metrics:
        fams = [_with_created(fam, engine.created) for fam in fams]
    return _text(fams, set(names) if names is not None else None)


def _with_created(fam: Family, created: float) -> Family:
    """prometheus_client's `_created` sample of each counter and histogram series (vLLM leaves
    them on): a line per label set on a real page."""
    if fam.kind not in ("counter", "histogram", "summary"):
        return fam
    stem = fam.name.removesuffix("_total")
    label_sets = dict.fromkeys(
        ",".join(p for p in labels.split(",") if p and not p.startswith("le="))
        for _, labels, _ in fam.samples
    )
    extra = [(f"{stem}_created", labels, created) for labels in label_sets]
    return Family(fam.name, fam.kind, fam.help, [*fam.samples, *extra])


def _text(fams: Iterable[Family], names: set[str] | None) -> str:
    lines: list[str] = []
    for fam in fams:
        samples: Sequence[Sample] = fam.samples
        if names is not None:
            samples = [s for s in samples if s[0] in names]
            if not samples:
                continue
        lines.append(f"# HELP {fam.name} {fam.help}")
        lines.append(f"# TYPE {fam.name} {fam.kind}")
        lines.extend(f"{n}{{{labels}}} {_value(v)}" for n, labels, v in samples)
    return "\n".join(lines) + "\n" if lines else ""
