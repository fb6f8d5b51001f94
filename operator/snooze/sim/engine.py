"""The state of one simulated vLLM engine: sleep level, what is on the GPU, the paused scheduler."""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from dataclasses import dataclass, field

from snooze.sim.histograms import Histogram, request_histograms

log = logging.getLogger(__name__)

GIB = 1024**3
WEIGHTS = "weights"
KV_CACHE = "kv_cache"
KNOWN_TAGS = (WEIGHTS, KV_CACHE)
SLEEP_MODES = ("abort", "wait", "keep")
GARBAGE_MARKER = "<garbage: weights not reloaded>"
# Deterministic filler text: tests compare outputs, so no randomness.
FILLER = ("lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit")
# The message vLLM 0.18+ puts in its 500 when the hybrid-model KV re-init crashes (issue #41564).
HYBRID_CRASH_MESSAGE = (
    "AttributeError: 'list' object has no attribute 'zero_' "
    "(in GPUModelRunner.init_fp8_kv_scales during wake_up)"
)


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """How one simulated engine behaves; defaults are realistic (VLLM.md), tests pass small ones."""

    model: str = "sim-model"
    """The served model name (`model_name` label, `/v1/models`)."""
    host: str = "127.0.0.1"
    """The loopback address to listen on."""
    port: int = 8000
    """The port; 0 picks a free one (read it back from `SimulatedEngine.port`)."""
    sleep_seconds: float = 5.7
    """Time a level-1 or level-2 sleep takes (level 0 only pauses, instantly)."""
    wake_seconds: float = 0.3
    """Time to bring the weights back (from host RAM after level 1, allocation after level 2)."""
    kv_wake_seconds: float = 0.05
    """Time to re-allocate the KV cache on wake."""
    reload_seconds: float = 20.0
    """Time `collective_rpc reload_weights` takes (weights from disk or page cache)."""
    token_seconds: float = 0.02
    """Pacing between generated tokens."""
    max_tokens_default: int = 16
    """Tokens generated when a request gives no `max_tokens` (finish reason `stop`)."""
    max_concurrency: int = 8
    """Requests running at once; the rest count as waiting."""
    gpu_memory_gib: float = 16.0
    """Simulated weights size on the GPU."""
    kv_cache_gib: float = 50.0
    """Simulated KV cache size on the GPU."""
    max_model_len: int = 8192
    """Reported in `/v1/models`."""
    dev_mode: bool = True
    """Serve the admin endpoints (`VLLM_SERVER_DEV_MODE=1`); off -> they are 404."""
    hybrid_wake_crash: bool = False
    """Reproduce vLLM issue #41564: a wake touching the KV cache fails with a 500."""
    startup_seconds: float = 0.0
    """Loading time before the engine listens at all (vLLM does not listen until loaded)."""
    full_metrics: bool = False
    """Emit a full-size vLLM payload (histograms) for scrape benchmarks."""


class EngineDead(Exception):
    """The engine was killed: its requests end without an answer."""


class WakeError(Exception):
    """A wake-up failed inside the engine (answered as HTTP 500)."""


@dataclass(eq=False)
class Request:
    """One inference request inside the engine."""

    prompt_tokens: int
    max_tokens: int = 16
    started: float = 0.0
    generated: int = 0
    aborted: bool = False
    admitted: bool = False
    arrived: float = field(default_factory=time.monotonic)


class SimulatedEngine:
    """One engine's state; its coroutines run in the loop that serves it."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.port = config.port
        self.sleep_level = 0
        self.is_sleeping = False
        self.weights_on_gpu = True
        self.kv_on_gpu = True
        self.weights_valid = True  # False after a level-2 sleep until reload_weights
        self.dead = False
        self.requests_served = 0
        self.sleep_calls = 0
        self.wake_calls = 0
        self.running = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.finished: dict[str, int] = {}
        self.seen: collections.Counter[str] = collections.Counter()
        """Requests received, by "METHOD /path" (as the engine's router read the path)."""
        self.ops_in_flight: dict[str, int] = {"sleep": 0, "wake": 0}
        self.op_durations = {op: Histogram.sleep_ops() for op in ("sleep", "wake")}
        # Only a full payload needs per-request histograms; the rest of the time they cost nothing.
        self.histograms = request_histograms() if config.full_metrics else {}
        self.created = time.time()
        self._paused = False  # tokens stall (sleep with mode keep, or asleep)
        self._admitting = True  # new requests may start running
        self._requests: set[Request] = set()
        self._cond = asyncio.Condition()
        self._admin = asyncio.Lock()  # vLLM's engine core runs utility calls one at a time

    @property
    def address(self) -> str:
        return f"{self.config.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    @property
    def waiting(self) -> int:
        return sum(1 for r in self._requests if not r.admitted)

    @property
    def sleep_state(self) -> str:
        """The `sleep_state` label vLLM sets: what the GPU gave away."""
        if not self.is_sleeping or self.sleep_level == 0:
            return "awake"
        return "weights_offloaded" if self.sleep_level == 1 else "discard_all"

    @property
    def gpu_memory_bytes(self) -> int:
        weights = self.config.gpu_memory_gib if self.weights_on_gpu else 0.0
        kv = self.config.kv_cache_gib if self.kv_on_gpu else 0.0
        return int((weights + kv) * GIB)

    async def _notify(self) -> None:
        async with self._cond:
            self._cond.notify_all()

    def kill(self) -> None:
        """Mark dead and release every waiter (called from the engine's loop)."""
        self.dead = True
        for request in self._requests:
            request.aborted = True
        asyncio.get_running_loop().create_task(self._notify())

    # --- inference -------------------------------------------------------------------------

    async def admit(self, request: Request) -> None:
        """Queue a request until the scheduler runs it: it hangs while the engine sleeps."""
        self._requests.add(request)
        async with self._cond:
            await self._cond.wait_for(
                lambda: (
                    request.aborted
                    or (self._admitting and not self._paused and self.running < self.max_running)
                )
            )
            self._check(request)
            if request.aborted:
                return
            request.admitted = True
            request.started = time.monotonic()
            self.running += 1
            self.prompt_tokens += request.prompt_tokens

    @property
    def max_running(self) -> int:
        return self.config.max_concurrency

    def _check(self, request: Request) -> None:
        if self.dead:
            raise EngineDead(self.address)

    async def next_token(self, request: Request, index: int) -> str | None:
        """The token at `index`, or None when the request was aborted (by a sleep)."""
        if self._paused and not request.aborted:
            async with self._cond:
                await self._cond.wait_for(lambda: request.aborted or not self._paused)
        self._check(request)
        if request.aborted:
            return None
        if self.config.token_seconds > 0:
            await asyncio.sleep(self.config.token_seconds)
            self._check(request)
            if request.aborted:
                return None
        if index == 0:
            self._observe("time_to_first_token_seconds", time.monotonic() - request.arrived)
        else:
            self._observe("inter_token_latency_seconds", self.config.token_seconds)
        self.generation_tokens += 1
        request.generated += 1
        word = FILLER[index % len(FILLER)]
        if index == 0 and not self.weights_valid:
            return f"{GARBAGE_MARKER} {word}"
        return word

    async def finish(self, request: Request, reason: str) -> None:
        """Count a finished request and free its slot."""
        self._requests.discard(request)
        if request.admitted:
            self.running -= 1
        if not self.dead:
            self.finished[reason] = self.finished.get(reason, 0) + 1
            if reason != "abort":
                self.requests_served += 1
            if self.histograms and request.admitted:
                self._observe_finished(request)
        await self._notify()

    def _observe(self, name: str, value: float) -> None:
        if self.histograms:
            self.histograms[name].observe(value)

    def _observe_finished(self, request: Request) -> None:
        now = time.monotonic()
        queued = request.started - request.arrived
        self._observe("e2e_request_latency_seconds", now - request.arrived)
        self._observe("request_queue_time_seconds", queued)
        self._observe("request_inference_time_seconds", now - request.started)
        self._observe("request_prefill_time_seconds", 0.0)
        self._observe("request_decode_time_seconds", now - request.started)
        self._observe("request_prompt_tokens", request.prompt_tokens)
        self._observe("request_generation_tokens", request.generated)
        self._observe("request_params_max_tokens", request.max_tokens)
        self._observe("iteration_tokens_total", request.prompt_tokens)

    # --- sleep mode -------------------------------------------------------------------------

    async def sleep(self, level: int, mode: str) -> int:
        """Sleep at `level`; an engine that already sleeps ignores it. Returns the level."""
        async with self._admin:
            self.sleep_calls += 1
            if self.is_sleeping:
                log.info("%s: already sleeping at level %d", self.address, self.sleep_level)
                return self.sleep_level
            with self._operation("sleep"):
                self._admitting = False
                if mode == "wait":
                    async with self._cond:
                        await self._cond.wait_for(lambda: self.running == 0)
                elif mode == "abort":
                    for request in self._requests:
                        request.aborted = True
                self._paused = True
                await self._notify()
                if level > 0:
                    await asyncio.sleep(self.config.sleep_seconds)
                    self.weights_on_gpu = False
                    self.kv_on_gpu = False
                    self.weights_valid = level == 1  # level 2 discards the weights
                self.sleep_level = level
                self.is_sleeping = True
            return level

    async def wake_up(self, tags: list[str] | None) -> bool:
        """Wake the given parts (None: everything); True once the engine is fully awake."""
        async with self._admin:
            self.wake_calls += 1
            wanted = set(KNOWN_TAGS) if tags is None else set(tags)
            for tag in wanted - set(KNOWN_TAGS):
                log.warning("%s: unknown wake-up tag %r ignored", self.address, tag)
            if not self.is_sleeping:
                return True
            with self._operation("wake"):
                if WEIGHTS in wanted and not self.weights_on_gpu:
                    await asyncio.sleep(self.config.wake_seconds)
                    self.weights_on_gpu = True
                if KV_CACHE in wanted and not self.kv_on_gpu:
                    await asyncio.sleep(self.config.kv_wake_seconds)
                    if self.config.hybrid_wake_crash:
                        raise WakeError(HYBRID_CRASH_MESSAGE)
                    self.kv_on_gpu = True
                if self.weights_on_gpu and self.kv_on_gpu:
                    self.is_sleeping = False
                    self.sleep_level = 0
                    self._paused = False
                    self._admitting = True
                    await self._notify()
            return not self.is_sleeping

    async def reload_weights(self) -> None:
        """`collective_rpc reload_weights`: read the weights again (needed after level 2)."""
        async with self._admin:
            if not self.weights_on_gpu:
                raise WakeError("RuntimeError: weights are not on the GPU; wake_up tags=weights")
            await asyncio.sleep(self.config.reload_seconds)
            self.weights_valid = True

    def _operation(self, name: str) -> _Timed:
        return _Timed(self, name)


class _Timed:
    """Counts a sleep-mode operation in flight and records its duration, as vLLM 0.32+ does."""

    def __init__(self, engine: SimulatedEngine, name: str) -> None:
        self._engine = engine
        self._name = name
        self._started = 0.0

    def __enter__(self) -> None:
        self._started = time.monotonic()
        self._engine.ops_in_flight[self._name] += 1

    def __exit__(self, *exc: object) -> None:
        self._engine.ops_in_flight[self._name] -= 1
        self._engine.op_durations[self._name].observe(time.monotonic() - self._started)
