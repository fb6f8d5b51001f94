"""How one simulated engine is configured: its model, its timings, its memory, the vLLM release
whose contract it speaks, and the failures it is made to have."""

from __future__ import annotations

from dataclasses import dataclass

from snooze.api import enginetimes
from snooze.sim.contract import DEFAULT_VERSION


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """How one simulated engine behaves; defaults are realistic (docs/vllm-contract.md), tests
    pass small ones."""

    model: str = "sim-model"
    """The served model name (`model_name` label, `/v1/models`)."""
    host: str = "127.0.0.1"
    """The loopback address to listen on."""
    port: int = 8000
    """The port; 0 picks a free one (read it back from `SimulatedEngine.port`)."""
    # The engine's timings (api/enginetimes.py says what each is).
    sleep_seconds: float = enginetimes.SLEEP_SECONDS
    pinning_share: float = enginetimes.PINNING_SHARE
    level2_sleep_seconds: float = enginetimes.LEVEL2_SLEEP_SECONDS
    wake_seconds: float = enginetimes.WAKE_SECONDS
    kv_wake_seconds: float = enginetimes.KV_WAKE_SECONDS
    reload_seconds: float = enginetimes.RELOAD_SECONDS
    token_seconds: float = enginetimes.TOKEN_SECONDS
    max_tokens_default: int = enginetimes.DEFAULT_MAX_TOKENS
    max_concurrency: int = 8
    """Requests running at once; the rest count as waiting."""
    gpu_memory_gib: float = 16.0
    """Simulated weights size on the GPU."""
    kv_cache_gib: float = 50.0
    """Simulated KV cache size on the GPU."""
    asleep_memory_gib: float = 1.0
    """GPU memory that sleep does not free: the CUDA context, CUDA graphs, everything outside
    vLLM's sleep-aware allocator. Held awake and asleep; part of the awake footprint."""
    device: str | None = None
    """The shared device (a `SimulatedDevice` given to the pool) the engine runs on; None: a
    device of its own, where it never runs out of memory."""
    start_retry_seconds: float = 1.0
    """While its device lacks room at start, the engine retries this often, as a container
    that exits and restarts; it answers 503 meanwhile."""
    max_model_len: int = 8192
    """Reported in `/v1/models`."""
    dev_mode: bool = True
    """Serve the admin endpoints (`VLLM_SERVER_DEV_MODE=1`); off -> they are 404."""
    hybrid_wake_crash: bool = False
    """Reproduce vLLM issue #41564: a wake touching the KV cache fails with a 500."""
    frees_nothing: bool = False
    """An engine that lies, or whose sleep is broken: it answers /sleep and says it sleeps,
    but keeps all its device memory. A neighbour whose wake counts on that memory runs out of
    memory."""
    startup_seconds: float = 0.0
    """Loading time before the engine listens at all (vLLM does not listen until loaded)."""
    full_metrics: bool = False
    """Emit a full-size vLLM payload (histograms) for scrape benchmarks."""
    vllm_version: str = DEFAULT_VERSION
    """The vLLM release whose HTTP contract it speaks (sim/contract.py): which routes exist,
    what /sleep and /pause take and answer, which metrics it publishes."""
    tensor_parallel_size: int = 1
    """Ranks a layer is split over: one weight digest per rank; and before vLLM 0.25.0 a
    /sleep that meets requests in flight kills a parallel engine (vllm#45520)."""
    pipeline_parallel_size: int = 1
    """Pipeline stages: they too make that /sleep fatal before 0.25.0."""
    wake_corrupts_weights: bool = False
    """From its first wake on, one weight tensor is restored wrong: /weight_checker's digests
    differ, while the short greedy answer does not show it (combine with
    wake_changes_output for an engine whose answers differ too)."""
    wake_changes_output: bool = False
    """From its first wake on, its answers differ from those before its sleep while its
    weights' digests stay the same (as the LoRA state lost by vllm#53888)."""
    nondeterministic: bool = False
    """Its greedy answers differ from one request to the next (the last token varies)."""
    num_layers: int = 32
    """Decoder layers, as in the model's config: /weight_checker answers a digest per weight
    tensor per rank, six tensors a layer (a Llama-3-8B has 32 layers; a 70B, 80)."""
    checksum_seconds_per_gib: float = 1.0
    """Time /weight_checker takes per GiB of weights on one rank: vLLM copies every tensor to
    host memory and SHA-256s it. benchmarks/verify.py measured vLLM's own function at 0.95 to
    1.15 s per GiB on one core; the copy adds about 0.08 s per GiB at 12 GiB/s."""
