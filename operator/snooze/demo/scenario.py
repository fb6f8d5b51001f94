"""The demo's scenario, pure: its models, their engines' latencies by size, and the traffic plan."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from snooze.api import enginetimes
from snooze.api.durations import format_duration
from snooze.api.models import NEVER

# The scenario is written for a 60-second run; --duration stretches or squeezes its clock.
BASE_DURATION = 60.0
# vLLM's published figures (docs/vllm-contract.md), per GiB moved: a level-1 sleep freed 39
# GiB in 5.7 s (an engine's first: later ones reuse its pinned host blocks and take the
# simulator's pinning_share less); a level-1 wake brought 73.9 GiB back in ~0.3 s (the llm-d
# figure, 3 s for 64 GiB, is a slower path).
SLEEP_SECONDS_PER_GIB = 5.7 / 39
# A level-2 sleep copies nothing: an 8B model freed 47.4 GiB in 0.31 s (vLLM PR #48337, A100).
LEVEL2_SLEEP_SECONDS_PER_GIB = 0.31 / 47.4
WAKE_SECONDS_PER_GIB = 0.3 / 73.9
# A level-2 wake re-reads the weights; 10 GiB/s is a warm page cache on a fast NVMe host.
RELOAD_GIB_PER_SECOND = 10.0
# A real cold start takes 30 to 100+ s (vLLM blog); the demo compresses it to a few seconds
# so that a minute shows every tier, and says so.
COLD_START_SECONDS = 2.0
COLD_START_GIB_PER_SECOND = 16.0
# vLLM's /weight_checker hashes the weights on the host, about a second per GiB
# (benchmarks/README.md): each engine pays it once, at its first sleep. The demo compresses
# it as it does a cold start, so that a minute still shows every tier.
CHECKSUM_SECONDS_PER_GIB = 0.02
TOKENS = 12
SGLANG_REFERENCE_GIB = 16.0
"""The weights that api/enginetimes.py's SGLang release and resume times move."""
ASLEEP_GIB = 1.0
"""What a sleeping engine still holds on its GPU (the simulator's default)."""
# The pool scene: four models of 30 GiB on one GPU of 70 GiB, two awake at most. A member's
# container starts (image, Python, CUDA) before vLLM checks the device's free memory; that is
# the time the pool has to put an awake member to sleep for it (a real start takes tens of
# seconds, a level-1 sleep of 29 GiB about 4 s): the demo's is longer than that sleep plus the
# operator's reaction.
POOL = "gpu-0"
POOL_MEMORY_GIB = 70.0
POOL_CONTAINER_START_SECONDS = 7.0
POOL_REACTION_PROBES = 6
"""Probe intervals left for the operator to see the new pod and choose whom to evict (it
takes about four): a member's container start stays above that plus its sleep at every
--time-scale, since the demo's probe interval has a floor (run.py's Settings)."""
PROBE_INTERVAL_FLOOR = 0.2


def probe_interval(scale: float) -> float:
    """The operator's probe interval in a demo at `scale` (pure)."""
    return max(PROBE_INTERVAL_FLOOR, scale)


POOL_MIN_RESIDENCY_SECONDS = 5.0
POOL_MEMBERS = ("translate", "sql", "legal", "support")
POOL_LATE = ("legal", "support")
"""Deployed once the traffic starts, onto a GPU whose room the first two hold."""
# (start, the two members asked): each phase asks for two members, so the pool swaps.
POOL_PHASES = (
    (10.0, ("translate", "sql")),
    (22.5, ("support", "legal")),
    (35.0, ("translate", "legal")),
    (47.5, ("sql", "support")),
)


@dataclass(frozen=True, kw_only=True)
class Size:
    """A model's footprint on one GPU: what sleep frees and what a wake or reload moves."""

    label: str
    weights_gib: float
    kv_cache_gib: float
    token_seconds: float


SIZES = {
    "8b": Size(label="Llama-3.1-8B bf16", weights_gib=15.0, kv_cache_gib=50.0, token_seconds=0.02),
    "14b": Size(label="Qwen2.5-14B bf16", weights_gib=27.5, kv_cache_gib=40.0, token_seconds=0.03),
    "32b": Size(label="Qwen2.5-32B bf16", weights_gib=61.0, kv_cache_gib=12.0, token_seconds=0.05),
    "27b-hybrid": Size(
        label="Qwen3.5-27B NVFP4 (hybrid)", weights_gib=17.0, kv_cache_gib=50.0, token_seconds=0.03
    ),
    # With 1 GiB that sleep keeps (CUDA context, graphs): 30 GiB awake, 0.43 of the GPU.
    "8b-pooled": Size(
        label="Llama-3.1-8B bf16, shared", weights_gib=15.0, kv_cache_gib=14.0, token_seconds=0.02
    ),
}


def engine_latencies(size: Size, *, scale: float) -> dict[str, float]:
    """EngineConfig latencies for a model of `size`, every one multiplied by `scale` (pure)."""
    freed = size.weights_gib + size.kv_cache_gib
    wake = WAKE_SECONDS_PER_GIB * freed
    return {
        "sleep_seconds": round(SLEEP_SECONDS_PER_GIB * freed * scale, 3),
        "level2_sleep_seconds": round(LEVEL2_SLEEP_SECONDS_PER_GIB * freed * scale, 3),
        "wake_seconds": round(wake * scale, 3),
        "kv_wake_seconds": round(0.05 * scale, 3),
        "reload_seconds": round(size.weights_gib / RELOAD_GIB_PER_SECOND * scale, 3),
        "startup_seconds": round(cold_start_seconds(size) * scale, 3),
        "token_seconds": round(size.token_seconds * scale, 4),
        "checksum_seconds_per_gib": round(CHECKSUM_SECONDS_PER_GIB * scale, 4),
        "gpu_memory_gib": size.weights_gib,
        "kv_cache_gib": size.kv_cache_gib,
    }


def sglang_latencies(size: Size, *, scale: float) -> dict[str, Any]:
    """An SGLang server's config for a model of `size` (pure): a release that keeps a host
    copy and a resume, each moving the weights at api/enginetimes.py's rate; the rest as
    vLLM's."""
    moved = size.weights_gib / SGLANG_REFERENCE_GIB
    return {
        **engine_latencies(size, scale=scale),
        "sleep_seconds": round(enginetimes.SGLANG_RELEASE_SECONDS * moved * scale, 3),
        "wake_seconds": round(enginetimes.SGLANG_RESUME_SECONDS * moved * scale, 3),
        "engine_kind": "sglang",
        "weights_cpu_backup": True,
    }


def cold_start_seconds(size: Size) -> float:
    """The compressed cold start: a fixed part plus the weights read at a fast disk's speed."""
    return COLD_START_SECONDS + size.weights_gib / COLD_START_GIB_PER_SECOND


@dataclass(frozen=True, kw_only=True)
class ModelPlan:
    """One model of the scenario: its InferenceModel spec, its Deployment, its engines."""

    name: str
    role: str
    size: Size
    replicas: int
    spec: dict[str, Any]
    engine: dict[str, Any]
    expected_failures: int = 0
    """Requests the scenario expects to fail (none: the gateway holds through every remedy)."""
    pool: str | None = None
    """The GPUPool its engines share a GPU in (spec.pool.name)."""
    deploy_at: float | None = None
    """Seconds into the scenario when its InferenceModel and Deployment are created; None:
    before the traffic starts."""
    container_start_seconds: float = 0.0
    """From its pod appearing on the node to its engine starting (then it loads)."""


@dataclass(frozen=True, kw_only=True)
class PoolPlan:
    """A GPU that several models' engines share, and its GPUPool."""

    name: str
    memory_gib: float
    spec: dict[str, Any]
    members: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class Planned:
    """One request of the traffic plan, `at` seconds after the scenario starts."""

    at: float
    model: str
    stream: bool


@dataclass(frozen=True, kw_only=True)
class Scenario:
    duration: float
    scale: float
    models: tuple[ModelPlan, ...]
    traffic: tuple[Planned, ...] = field(default_factory=tuple)
    pools: tuple[PoolPlan, ...] = ()

    @property
    def model_names(self) -> list[str]:
        return [m.name for m in self.models]

    @property
    def first_models(self) -> list[ModelPlan]:
        """The models deployed before the traffic starts."""
        return [m for m in self.models if m.deploy_at is None]

    def model(self, name: str) -> ModelPlan:
        return next(m for m in self.models if m.name == name)


def seconds(value: float) -> str:
    """A Kubernetes-style duration for the spec, in milliseconds when it is not whole (pure)."""
    millis = max(1, round(value * 1000))
    return f"{millis // 1000}s" if millis % 1000 == 0 else f"{millis}ms"


def build(
    *, duration: float = BASE_DURATION, scale: float = 1.0, seed: int = 0, hybrid_crash: bool = True
) -> Scenario:
    """The scenario for a run of `duration` seconds with latencies and timers times `scale`."""
    if duration <= 0 or scale <= 0:
        raise ValueError("duration and time scale must be greater than zero")
    stretch = duration / BASE_DURATION

    def spec(name: str, level: int, idle: float | None, **extra: Any) -> dict[str, Any]:
        body: dict[str, Any] = {
            "modelName": name,
            "selector": {"matchLabels": {"app": name}},
            "idle": {"after": NEVER if idle is None else seconds(idle * scale)},
            "sleep": {"level": level},
            "wake": {"timeout": seconds(max(60.0, 30 * scale))},
        }
        for key, value in extra.items():
            body[key] = {**body.get(key, {}), **value} if isinstance(value, dict) else value
        return body

    def engine(size: Size) -> dict[str, Any]:
        return {**engine_latencies(size, scale=scale), "max_tokens_default": TOKENS}

    hybrid = SIZES["27b-hybrid"]
    summarize_idle = 5.0
    models = (
        ModelPlan(
            name="chat",
            role="busy: a request about every second, never idle",
            size=SIZES["8b"],
            replicas=2,
            spec=spec("chat", 1, 8.0),
            engine=engine(SIZES["8b"]),
        ),
        ModelPlan(
            name="code",
            role="bursty: bursts of 8 with long gaps; sleeps at level 2 between them",
            size=SIZES["14b"],
            replicas=1,
            spec=spec("code", 2, 6.0),
            engine=engine(SIZES["14b"]),
        ),
        ModelPlan(
            name="summarize",
            role="rare: asked once; asleep, then zero replicas, back by a cold start",
            size=SIZES["32b"],
            replicas=1,
            spec=spec(
                "summarize",
                2,
                summarize_idle,
                scaleTargetRef={"kind": "Deployment", "name": "summarize"},
                scaleToZeroAfter=seconds(summarize_idle * 4 * scale),
                wake={"coldStartTimeout": seconds(max(120.0, 60 * scale))},
            ),
            engine=engine(SIZES["32b"]),
        ),
        ModelPlan(
            name="hybrid-unpatched",
            role="hybrid on an unpatched engine: the wake crashes, Restart remedies it"
            if hybrid_crash
            else "hybrid on an unpatched engine (crash switched off)",
            size=hybrid,
            replicas=1,
            spec=spec(
                "hybrid-unpatched", 1, 5.0, wake={"onFailure": "Restart", "failureThreshold": 1}
            ),
            engine={**engine(hybrid), "hybrid_wake_crash": hybrid_crash},
        ),
        ModelPlan(
            name="hybrid-patched",
            role="the same hybrid model on the patched image: wakes fine",
            size=hybrid,
            replicas=1,
            spec=spec("hybrid-patched", 1, 5.0),
            engine=engine(hybrid),
        ),
        ModelPlan(
            name="qa",
            role="an SGLang server: released when idle (its weights kept in host RAM), "
            "resumed for a request",
            size=SIZES["8b"],
            replicas=1,
            spec=spec("qa", 1, 5.0, engine={"kind": "sglang"}),
            engine={**sglang_latencies(SIZES["8b"], scale=scale), "max_tokens_default": TOKENS},
        ),
    )
    pooled = SIZES["8b-pooled"]
    footprint = pooled.weights_gib + pooled.kv_cache_gib + ASLEEP_GIB
    members = tuple(
        ModelPlan(
            name=name,
            role=f"GPUPool {POOL}: "
            + (
                "deployed at the start; the pool puts one of the first two to sleep before it loads"
                if name in POOL_LATE
                else "asked in turns with the others; sleeps only when the pool needs the room"
            ),
            size=pooled,
            replicas=1,
            spec=spec(
                name,
                1,
                None,  # idle.after: Never: only the pool puts it to sleep, for another member
                pool={
                    "name": POOL,
                    "memory": f"{footprint:g}Gi",
                    "asleepMemory": f"{ASLEEP_GIB:g}Gi",
                },
            ),
            engine={
                **engine(pooled),
                # The load alone: the container's start comes before it.
                "startup_seconds": round(pooled.weights_gib / COLD_START_GIB_PER_SECOND * scale, 3),
                "device": POOL,
                "asleep_memory_gib": ASLEEP_GIB,
                "start_retry_seconds": round(max(0.1, 0.5 * scale), 3),
            },
            pool=POOL,
            deploy_at=0.5 * stretch if name in POOL_LATE else None,
            container_start_seconds=round(
                max(
                    POOL_CONTAINER_START_SECONDS * scale,
                    engine(pooled)["sleep_seconds"] + POOL_REACTION_PROBES * probe_interval(scale),
                ),
                3,
            ),
        )
        for name in POOL_MEMBERS
    )
    pool = PoolPlan(
        name=POOL,
        memory_gib=POOL_MEMORY_GIB,
        spec={
            "memory": f"{POOL_MEMORY_GIB:g}Gi",
            "minResidency": seconds(POOL_MIN_RESIDENCY_SECONDS * scale),
        },
        members=POOL_MEMBERS,
    )
    return Scenario(
        duration=duration,
        scale=scale,
        models=models + members,
        traffic=tuple(plan_traffic(duration=duration, stretch=stretch, seed=seed)),
        pools=(pool,),
    )


def plan_traffic(*, duration: float, stretch: float, seed: int) -> list[Planned]:
    """The requests, sorted by time: times are the 60-second plan's times times `stretch`."""
    rng = random.Random(seed)
    plan: list[Planned] = []
    t = 0.5
    while t < BASE_DURATION - 1:
        plan.append(Planned(at=t * stretch, model="chat", stream=rng.random() < 0.3))
        t += rng.uniform(0.7, 1.3)
    for burst in (1.0, 25.0, 50.0):
        for i in range(8):
            plan.append(Planned(at=(burst + i * 0.4) * stretch, model="code", stream=i % 2 == 0))
    plan.append(Planned(at=40.0 * stretch, model="summarize", stream=True))
    plan.append(Planned(at=24.0 * stretch, model="hybrid-unpatched", stream=False))
    plan.append(Planned(at=24.0 * stretch, model="hybrid-patched", stream=False))
    for at in (2.0, 2.5, 3.0, 30.0, 30.5, 52.0):
        plan.append(Planned(at=at * stretch, model="qa", stream=at == 30.0))
    for start, asked in POOL_PHASES:
        # The second member of a phase is used last: the pool's least recently used is clear.
        for offset, model in zip((0.0, 0.7), asked, strict=True):
            for i in range(7):
                at = start + offset + i * 1.5
                plan.append(Planned(at=at * stretch, model=model, stream=i % 2 == 1))
    return sorted((p for p in plan if p.at < duration), key=lambda p: (p.at, p.model))


def describe(scenario: Scenario) -> list[str]:
    """Lines that say what the run does and how its time is compressed (pure)."""
    lines = [
        f"scenario: {format_duration(scenario.duration)}, latencies and idle timers x"
        f"{scenario.scale:g}; {len(scenario.traffic)} requests planned",
        f"cold starts are compressed to a few seconds (a real vLLM load takes 30-100+ s); "
        f"wakes and sleeps follow vLLM's published figures x{scenario.scale:g}",
    ]
    for m in scenario.models:
        e, level = m.engine, m.spec["sleep"]["level"]
        lines.append(
            f"  {m.name:<17} {m.size.label:<27} {m.replicas} pod(s), level "
            f"{level}, idle {m.spec['idle']['after']}: {m.role}; "
            f"{'first ' if level == 1 else ''}sleep "
            f"{e['sleep_seconds' if level == 1 else 'level2_sleep_seconds']:.2g}s"
            f" wake {e['wake_seconds']:.2g}s"
            + (f" reload {e['reload_seconds']:.2g}s" if level == 2 else "")
            + (
                f" start {m.container_start_seconds:.2g}s + load {e['startup_seconds']:.2g}s"
                if m.container_start_seconds
                else f" load {e['startup_seconds']:.2g}s"
            )
        )
    for pool in scenario.pools:
        members = [scenario.model(name) for name in pool.members]
        awake = max(m.engine["gpu_memory_gib"] + m.engine["kv_cache_gib"] for m in members)
        fit = int((pool.memory_gib - ASLEEP_GIB * len(members)) // awake)
        lines.append(
            f"  GPUPool {pool.name}: one GPU of {pool.memory_gib:g} GiB for {len(members)} "
            f"models of {awake + ASLEEP_GIB:g} GiB ({ASLEEP_GIB:g} GiB asleep): {fit} awake at "
            f"once; a request for a sleeping one waits while the least recently used sleeps"
        )
    return lines
