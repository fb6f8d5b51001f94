"""The state of one simulated vLLM engine: sleep level, what is on the GPU, the paused scheduler."""

from __future__ import annotations

import asyncio
import collections
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from snooze.sim import outputs
from snooze.sim.config import EngineConfig
from snooze.sim.contract import Contract
from snooze.sim.device import KV_CACHE, WAKE_OUT_OF_MEMORY, WEIGHTS, DeviceShare, SimulatedDevice
from snooze.sim.histograms import Histogram, request_histograms
from snooze.sim.outputs import (
    FILLER,
    GARBAGE,
    INTACT,
    NONSENSE,
    RIGHT,
    WRONG,
    WRONG_WEIGHTS,
    ZEROED,
)

log = logging.getLogger(__name__)

KNOWN_TAGS = (WEIGHTS, KV_CACHE)
SLEEP_MODES = ("abort", "wait", "keep")
GARBAGE_MARKER = "<garbage: weights not reloaded>"
PAUSED_MESSAGE = "Generation is paused. Please retry after it resumes."
__all__ = ["FILLER", "GARBAGE_MARKER", "EngineConfig", "SimulatedEngine"]
# The message vLLM 0.18+ puts in its 500 when the hybrid-model KV re-init crashes (issue #41564):
# the worker's AttributeError, as the engine core reports a failed utility call (0.26: the
# wake-up's post_kv_cache_wake_up calls init_fp8_kv_scales).
HYBRID_CRASH_MESSAGE = "Call to wake_up method failed: 'list' object has no attribute 'zero_'"


class EngineDead(Exception):
    """The engine was killed: its requests end without an answer."""


class WakeError(Exception):
    """A wake-up failed inside the engine (answered as HTTP 500)."""


class EnginePaused(Exception):
    """A new request while /pause holds the engine in abort or wait mode (vLLM 0.33+: 503)."""


@dataclass(eq=False)
class Request:
    """One inference request inside the engine."""

    prompt_tokens: int
    max_tokens: int = 16
    prompt: str = ""
    """The prompt's text: what the generated tokens are a function of."""
    jitter: int = 0
    """Nonzero for an engine whose greedy answers vary (EngineConfig.nondeterministic)."""
    token_ids: list[int] = field(default_factory=list)
    """The ids of the tokens generated so far."""
    started: float = 0.0
    generated: int = 0
    aborted: bool = False
    admitted: bool = False
    arrived: float = field(default_factory=time.monotonic)


class SimulatedEngine:
    """One engine's state; its coroutines run in the loop that serves it."""

    def __init__(self, config: EngineConfig, device: SimulatedDevice | None = None) -> None:
        self.config = config
        self.contract = Contract(config.vllm_version)
        self.port = config.port
        self.sleep_level = 0
        self.is_sleeping = False
        self.memory = DeviceShare(
            device,
            weights_gib=config.gpu_memory_gib,
            kv_cache_gib=config.kv_cache_gib,
            residue_gib=config.asleep_memory_gib,
            owner=config.host,
        )
        self.loaded = False
        """Its memory taken and the model loaded; until then every route but /metrics is 503."""
        self.start_refusal: str | None = None
        """vLLM's ValueError from the last start that found too little free memory."""
        self.restarts = 0
        """Starts refused for want of memory: each one an exit and a restart of the container."""
        self._sleeping_tags: set[str] = set()  # as vLLM's executor: what a wake must bring back
        self._starting: asyncio.Task[None] | None = None
        self.weights_state = INTACT
        """What its weights are: outputs.INTACT, or how they went wrong."""
        self.answers_off = False
        """A wake left its answers different while its weights are right (wake_changes_output)."""
        self.dead = False
        self.on_crash: Callable[[], None] = lambda: None
        """Called when the engine dies by itself (a /sleep that hits vllm#45520): the pool
        stops serving it, as a dead container stops answering."""
        self.user_paused = False
        """Paused by /pause, until /resume."""
        self.reject_new = False
        """New requests get 503 while paused (vLLM 0.33+, abort and wait modes)."""
        self.checksum_calls = 0
        self.crashed = False
        """It died of a /sleep with requests in flight (vllm#45520)."""
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
    def device(self) -> SimulatedDevice:
        return self.memory.device

    @property
    def gpu_memory_bytes(self) -> int:
        """What this engine holds on its device now (its residue alone while it sleeps)."""
        return self.memory.used_bytes

    @property
    def host_memory_bytes(self) -> int:
        """Pinned host RAM: the weights' copy of a level-1 sleep, kept after the wake."""
        return self.memory.host_bytes

    @property
    def weights_on_gpu(self) -> bool:
        return WEIGHTS in self.memory.on_gpu

    @property
    def kv_on_gpu(self) -> bool:
        return KV_CACHE in self.memory.on_gpu

    @property
    def oom_total(self) -> int:
        """Allocations this engine was refused (starts and wakes)."""
        return sum(self.memory.oom_total.values())

    def try_to_load(self) -> bool:
        """Take the footprint as vLLM checks it at start; False, logged as vLLM would, if short."""
        before, self.start_refusal = self.start_refusal, self.memory.take_all()
        if self.start_refusal is None:
            return True
        self.restarts += 1
        # vLLM's worker dies with this ValueError and the container restarts; said once, not
        # every second, until the free memory changes.
        level = logging.ERROR if self.start_refusal != before else logging.DEBUG
        log.log(level, "%s: ValueError: %s", self.address, self.start_refusal)
        return False

    async def load_model(self) -> None:
        """Load, once the memory is taken (startup_seconds)."""
        if self.config.startup_seconds > 0:
            await asyncio.sleep(self.config.startup_seconds)
        self.loaded = True

    def retry_start(self) -> None:
        """Try again every start_retry_seconds until the device has room, then load."""

        async def retry() -> None:
            while True:
                await asyncio.sleep(self.config.start_retry_seconds)
                if self.try_to_load():
                    break
            await self.load_model()
            log.info("%s: loaded after %d failed start(s)", self.address, self.restarts)

        self._starting = asyncio.get_running_loop().create_task(retry())

    async def _notify(self) -> None:
        async with self._cond:
            self._cond.notify_all()

    def kill(self) -> None:
        """Mark dead and release every waiter (called from the engine's loop)."""
        self.dead = True
        if self._starting is not None:
            self._starting.cancel()
        self.memory.release_all()
        for request in self._requests:
            request.aborted = True
        asyncio.get_running_loop().create_task(self._notify())

    # --- inference -------------------------------------------------------------------------

    async def admit(self, request: Request) -> None:
        """Queue a request until the scheduler runs it: it hangs while the engine sleeps, and
        while /pause holds it (unless the release refuses new requests then)."""
        if self.reject_new:
            raise EnginePaused(PAUSED_MESSAGE)
        if self.config.nondeterministic:
            request.jitter = random.getrandbits(32) or 1
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
        answers = self.answers
        # A model whose greedy answers vary differs in its last token.
        jitter = request.jitter if index == request.max_tokens - 1 else 0
        request.token_ids.append(
            outputs.token_id(self.config.model, request.prompt, index, answers, jitter)
        )
        text = outputs.word(index, answers)
        if index == 0 and answers == NONSENSE:
            return f"{GARBAGE_MARKER} {text}"
        return text

    @property
    def answers(self) -> str:
        """What its answers are (outputs.RIGHT, WRONG or NONSENSE)."""
        if self.weights_state in (GARBAGE, ZEROED):
            return NONSENSE
        return WRONG if self.answers_off else RIGHT

    @property
    def weights_valid(self) -> bool:
        """Its weights are as loaded (not discarded by a level-2 sleep, zeroed, or restored
        wrong)."""
        return self.weights_state == INTACT

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
                # Requests still running when the memory is unmapped: vllm#45520.
                racing = self.running > 0 and mode != "wait"
                self._admitting = False
                if mode == "wait":
                    async with self._cond:
                        await self._cond.wait_for(lambda: self.running == 0)
                elif mode == "abort":
                    for request in self._requests:
                        request.aborted = True
                self._paused = True
                await self._notify()
                if level > 0 and racing and self._dies_of_racing_sleep():
                    self._crash()
                    return level  # answered 200 all the same, as vLLM does
                if level > 0:
                    await asyncio.sleep(self.sleep_duration(level))
                    # Level 1 copies the weights to pinned host RAM; level 2 discards them.
                    if not self.config.frees_nothing:
                        self.memory.unmap(keep_weights_in_host_ram=level == 1)
                    self._sleeping_tags = set(KNOWN_TAGS)
                    if level == 2:
                        self.weights_state = GARBAGE
                self.sleep_level = level
                self.is_sleeping = True
            return level

    def _dies_of_racing_sleep(self) -> bool:
        """A parallel engine of a release that unmaps without synchronizing the device."""
        cfg = self.config
        parallel = cfg.tensor_parallel_size > 1 or cfg.pipeline_parallel_size > 1
        return parallel and not self.contract.syncs_before_unmap

    def _crash(self) -> None:
        log.error(
            "%s: CUDA error: an illegal memory access was encountered (a /sleep unmapped "
            "memory under requests in flight, vllm#45520); EngineCore died",
            self.address,
        )
        self.crashed = True
        # After the /sleep answer has gone out: vLLM's says 200 while the engine dies.
        asyncio.get_running_loop().call_later(0.05, self.on_crash)

    def sleep_duration(self, level: int) -> float:
        """How long a sleep at `level` (1 or 2) takes now: a level-1 sleep that finds its
        pinned blocks kept from an earlier one only copies."""
        config = self.config
        if level != 1:
            return config.level2_sleep_seconds
        if self.memory.pinned_bytes >= self.memory.part_bytes[WEIGHTS]:
            return config.sleep_seconds * (1 - config.pinning_share)
        return config.sleep_seconds

    async def wake_up(self, tags: list[str] | None) -> bool:
        """Wake the given parts (None: everything); True once the engine is fully awake.

        As vLLM's executor: a tag that is not asleep makes the whole call a no-op (a warning);
        a part that finds no room on the device fails the call (HTTP 500), parts mapped before
        it stay mapped, and the engine stays asleep until a wake succeeds.
        """
        async with self._admin:
            self.wake_calls += 1
            if not self.is_sleeping:
                return True
            asleep = self._sleeping_tags
            if asleep and tags is not None and not set(tags) <= asleep:
                log.warning(
                    "%s: wake-up tags %s not all in sleeping tags %s",
                    self.address,
                    tags,
                    sorted(asleep),
                )
                return False
            wanted = asleep if tags is None else set(tags)
            with self._operation("wake"):
                for part in KNOWN_TAGS:  # in allocation order, as CuMemAllocator maps them
                    if part in wanted:
                        await self._bring_back(part)
                self._sleeping_tags = asleep - wanted
                if not self._sleeping_tags:
                    self.is_sleeping = False
                    self.sleep_level = 0
                    self._paused = self.user_paused
                    self._admitting = not self.user_paused
                    self._spoil_on_wake()
                    await self._notify()
            return not self.is_sleeping

    def _spoil_on_wake(self) -> None:
        """The failures a wake can leave behind, when the engine is made to have them."""
        if self.config.wake_corrupts_weights and self.weights_state == INTACT:
            self.weights_state = WRONG_WEIGHTS
        if self.config.wake_changes_output:
            self.answers_off = True

    # --- pause (/pause, /resume, /is_paused) ---------------------------------------------------

    async def pause(self, mode: str) -> None:
        """Hold generation: abort what runs, wait for it, or keep it frozen (vLLM's
        pause_generation). From 0.33 new requests get 503 in abort and wait modes; before,
        and in keep mode, they queue until /resume."""
        async with self._admin:
            self.user_paused = True
            self._admitting = False
            if mode == "abort":
                for request in self._requests:
                    request.aborted = True
            elif mode == "wait":
                async with self._cond:
                    await self._cond.wait_for(lambda: self.running == 0)
            else:
                self._paused = True  # keep: running requests freeze where they are
            self.reject_new = self.contract.pause_rejects_new and mode != "keep"
            await self._notify()

    async def resume(self) -> None:
        async with self._admin:
            self.user_paused = False
            self.reject_new = False
            if not self.is_sleeping:
                self._paused = False
                self._admitting = True
            await self._notify()

    # --- weights (/weight_checker) -------------------------------------------------------------

    async def weight_checksums(self) -> dict[str, str]:
        """What vLLM's compute_weight_checksums gives: a digest per tensor and rank. It takes
        the time of copying and hashing one rank's share of the weights, during which the
        engine generates nothing (a utility call holds its busy loop)."""
        async with self._admin:
            self.checksum_calls += 1
            if not self.weights_on_gpu:
                raise WakeError("RuntimeError: weights are not on the GPU (the engine sleeps)")
            cfg = self.config
            ranks = cfg.tensor_parallel_size * cfg.pipeline_parallel_size
            seconds = cfg.checksum_seconds_per_gib * cfg.gpu_memory_gib / ranks
            paused, self._paused = self._paused, True
            try:
                await asyncio.sleep(seconds)
            finally:
                self._paused = paused
                await self._notify()
            return outputs.checksums(
                cfg.model,
                tensor_parallel=cfg.tensor_parallel_size,
                pipeline_parallel=cfg.pipeline_parallel_size,
                state=self.weights_state,
            )

    async def reset_weights(self) -> None:
        """/weight_checker's reset: every weight zeroed (answers are garbage until a reload)."""
        async with self._admin:
            self.weights_state = ZEROED

    async def _bring_back(self, part: str) -> None:
        if part not in self.memory.on_gpu:
            if not self.memory.map_again(part):
                device = self.device
                log.error(
                    "%s: waking %s: CUDA out of memory on %r (%d of %d bytes free)",
                    self.address,
                    part,
                    device.name,
                    device.free_bytes,
                    device.total_bytes,
                )
                raise WakeError(WAKE_OUT_OF_MEMORY)
            if part == WEIGHTS:
                await asyncio.sleep(self.config.wake_seconds)
            else:
                await asyncio.sleep(self.config.kv_wake_seconds)
        if part == KV_CACHE and self.config.hybrid_wake_crash:
            raise WakeError(HYBRID_CRASH_MESSAGE)

    async def reload_weights(self) -> None:
        """`collective_rpc reload_weights`: read the weights again (needed after level 2)."""
        async with self._admin:
            if not self.weights_on_gpu:
                raise WakeError("RuntimeError: weights are not on the GPU; wake_up tags=weights")
            await asyncio.sleep(self.config.reload_seconds)
            self.weights_state = INTACT

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
