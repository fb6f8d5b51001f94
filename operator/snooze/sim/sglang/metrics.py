"""The Prometheus text of a simulated SGLang server (--enable-metrics), with SGLang's metric names
and labels (srt/observability/metrics_collector.py in 0.5.23; srt/metrics/collector.py before)."""

from __future__ import annotations

from collections.abc import Collection

from snooze.sim.metrics import Family, _one, _text, simulator_families
from snooze.sim.sglang.engine import SGLangEngine


def _labels(engine: SGLangEngine) -> tuple[str, str]:
    """The scheduler's labels (its collector, one per rank: rank 0's here) and the tokenizer's."""
    model = engine.config.model
    tokenizer = f'model_name="{model}",engine_type="unified"'
    scheduler = tokenizer
    if engine.sglang.scheduler_rank_labels:
        scheduler += ',tp_rank="0",pp_rank="0"'
    if engine.sglang.release >= (0, 5, 23):
        scheduler += ',moe_ep_rank="0"'
    return scheduler, tokenizer


def families(engine: SGLangEngine) -> list[Family]:
    scheduler, tokenizer = _labels(engine)
    cfg = engine.config
    finished = sum(engine.finished.values())
    return [
        _one(
            "sglang:num_running_reqs",
            "gauge",
            "The number of running requests.",
            scheduler,
            engine.running_in_scheduler,
        ),
        _one(
            "sglang:num_queue_reqs",
            "gauge",
            "The number of requests in the waiting queue.",
            scheduler,
            engine.queued_in_scheduler,
        ),
        _one(
            "sglang:token_usage",
            "gauge",
            "The token usage.",
            scheduler,
            engine.running_in_scheduler / max(cfg.max_concurrency, 1),
        ),
        Family(
            "sglang:num_requests_total",
            "counter",
            "Number of requests processed.",
            [("sglang:num_requests_total", f'{tokenizer},is_streaming="false"', float(finished))],
        ),
        _one(
            "sglang:prompt_tokens_total",
            "counter",
            "Number of prefill tokens processed.",
            tokenizer,
            engine.prompt_tokens,
        ),
        _one(
            "sglang:generation_tokens_total",
            "counter",
            "Number of generation tokens processed.",
            tokenizer,
            engine.generation_tokens,
        ),
    ]


def render(engine: SGLangEngine, names: Collection[str] | None = None) -> str:
    """The text exposition; `names` filters as prometheus_client's `name[]` (SGLang mounts its
    ASGI app at /metrics)."""
    base = f'model_name="{engine.config.model}",engine="0"'
    fams = families(engine) if engine.loaded else []
    return _text(fams + simulator_families(engine, base), set(names) if names else None)
