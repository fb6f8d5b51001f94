"""Histograms with vLLM's own bucket lists, for the simulator's engines and their /metrics."""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass, field

Sample = tuple[str, str, float]  # sample name, label text without braces, value


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(word) for word in text.split())


# vLLM's bucket lists (vllm/v1/metrics/loggers.py), so that a full payload has the real size.
TTFT_BUCKETS = _floats("0.001 0.005 0.01 0.02 0.04 0.06 0.08 0.1 0.25 0.5 0.75 1 2.5 5 7.5 10")
TTFT_BUCKETS += _floats("20 40 80 160 640 2560")
LATENCY_BUCKETS = _floats("0.3 0.5 0.8 1 1.5 2 2.5 5 10 15 20 30 40 50 60 120 240 480 960 1920")
LATENCY_BUCKETS += (7680.0,)
ITL_BUCKETS = _floats("0.01 0.025 0.05 0.075 0.1 0.15 0.2 0.3 0.4 0.5 0.75 1 2.5 5 7.5 10 20 40 80")
TOKEN_BUCKETS = _floats("1 2 5 10 20 50 100 200 500 1000 2000 5000 10000")
ITERATION_BUCKETS = _floats("1 8 16 32 64 128 256 512 1024 2048 4096 8192 16384")
# vllm/entrypoints/serve/dev/sleep/metrics.py (0.32+).
SLEEP_OP_BUCKETS = _floats("0.01 0.1 1 10 30 60 120 300 600")


@dataclass
class Histogram:
    """A cumulative-bucket histogram, just enough to print one."""

    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    @classmethod
    def sleep_ops(cls) -> Histogram:
        return cls(SLEEP_OP_BUCKETS)

    @classmethod
    def request_latency(cls) -> Histogram:
        return cls(LATENCY_BUCKETS)

    def observe(self, value: float) -> None:
        index = bisect.bisect_left(self.buckets, value)
        if index < len(self.counts):
            self.counts[index] += 1  # cumulated when printed: observing stays O(log n)
        self.total += value
        self.count += 1

    def samples(self, name: str, labels: str) -> Iterator[Sample]:
        sep = "," if labels else ""
        running = 0
        for bound, hits in zip(self.buckets, self.counts, strict=True):
            running += hits
            yield f"{name}_bucket", f'{labels}{sep}le="{bound!r}"', float(running)
        yield f"{name}_bucket", f'{labels}{sep}le="+Inf"', float(self.count)
        yield f"{name}_count", labels, float(self.count)
        yield f"{name}_sum", labels, self.total


def request_histograms() -> dict[str, Histogram]:
    """Fresh histograms for a full payload, keyed by vLLM's name without the prefix."""
    buckets = {
        "time_to_first_token_seconds": TTFT_BUCKETS,
        "inter_token_latency_seconds": ITL_BUCKETS,
        "e2e_request_latency_seconds": LATENCY_BUCKETS,
        "request_queue_time_seconds": LATENCY_BUCKETS,
        "request_inference_time_seconds": LATENCY_BUCKETS,
        "request_prefill_time_seconds": LATENCY_BUCKETS,
        "request_decode_time_seconds": LATENCY_BUCKETS,
        "request_prompt_tokens": TOKEN_BUCKETS,
        "request_generation_tokens": TOKEN_BUCKETS,
        "request_params_max_tokens": TOKEN_BUCKETS,
        "iteration_tokens_total": ITERATION_BUCKETS,
        "request_params_n": TOKEN_BUCKETS,
        "request_max_num_generation_tokens": TOKEN_BUCKETS,
        "request_time_per_output_token_seconds": ITL_BUCKETS,
        "request_prefill_kv_computed_tokens": TOKEN_BUCKETS,
        "request_num_preemptions": TOKEN_BUCKETS,
    }
    return {name: Histogram(b) for name, b in buckets.items()}
