"""The Prometheus text exposition of a simulated engine, with vLLM's metric names and labels."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass

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
        Family(
            "vllm:engine_sleep_state",
            "gauge",
            "Engine sleep state; awake = 0 means asleep.",
            [
                (
                    "vllm:engine_sleep_state",
                    f'{base},sleep_state="{state}"',
                    1.0 if state == engine.sleep_state else 0.0,
                )
                for state in SLEEP_STATES
            ],
        ),
        Family(
            "vllm:sleep_mode_operations_in_flight",
            "gauge",
            "Sleep-mode operations currently awaited.",
            [
                ("vllm:sleep_mode_operations_in_flight", f'operation="{op}"', float(n))
                for op, n in engine.ops_in_flight.items()
            ],
        ),
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
        ),
        _one(
            "snooze_sim_gpu_memory_used_bytes",
            "gauge",
            "Simulator only: GPU memory the simulated engine holds.",
            base,
            engine.gpu_memory_bytes,
        ),
    ]
    if cfg.full_metrics:
        out.extend(_full(engine, base))
    return out


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
    ):
        yield _histogram(f"vllm:{name}", help_, hists[name], base)


def _value(value: float) -> str:
    # prometheus_client prints floats the Go way; repr matches it for the values used here.
    return repr(float(value))


def render(engine: SimulatedEngine, names: Collection[str] | None = None) -> str:
    """The text exposition; `names` filters like prometheus_client's `name[]`.

    prometheus_client keeps a family if any of its *sample* names is asked for, and only those
    samples: counters are asked for as `x_total`, histograms as `x_bucket`/`x_count`/`x_sum`.
    """
    return _text(families(engine), set(names) if names is not None else None)


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
