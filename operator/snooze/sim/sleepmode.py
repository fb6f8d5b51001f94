"""A simulated engine's sleep mode as its vLLM release has it: /sleep, /wake_up, the weight
reload, /release_kv_cache_memory, /pause and /resume, and /weight_checker.

Where releases differ (sim/contract.py names each), what is modelled is read in their source:
before 0.17 sleep goes straight to the executor; from 0.17 it pauses the engine core's
scheduler first, a full wake resumes it, and /pause and sleep are that one pause state.
The executor ignores a /sleep while it sleeps, yet the sleep-state gauge (0.11.1+) and the
answer (0.32+) take the level asked.
"""

from __future__ import annotations

import asyncio
import logging
import time

from snooze.sim import outputs
from snooze.sim.device import KV_CACHE, WAKE_OUT_OF_MEMORY, WEIGHTS
from snooze.sim.histograms import Histogram
from snooze.sim.outputs import GARBAGE, INTACT, WRONG_WEIGHTS, ZEROED
from snooze.sim.state import EngineState

log = logging.getLogger(__name__)

KNOWN_TAGS = (WEIGHTS, KV_CACHE)
SCHEDULING = "scheduling"
"""The wake tag that only resumes the scheduler (0.17+: a level-0 sleep's wake)."""
SLEEP_MODES = ("abort", "wait", "keep")
# The message vLLM 0.18+ puts in its 500 when the hybrid-model KV re-init crashes (issue #41564):
# the worker's AttributeError, as the engine core reports a failed utility call (0.26: the
# wake-up's post_kv_cache_wake_up calls init_fp8_kv_scales).
HYBRID_CRASH_MESSAGE = "Call to wake_up method failed: 'list' object has no attribute 'zero_'"
ILLEGAL_ACCESS = "CUDA error: an illegal memory access was encountered"
"""What CUDA says when a kernel or a copy reads memory that sleep unmapped: the error is sticky,
and the engine core dies of it."""
KV_RELEASE_NEEDS_PAUSE = "release_kv_cache_memory() requires a completed pause first"


class WakeError(Exception):
    """A wake-up (or another utility call) failed inside the engine (answered as HTTP 500)."""


class SleepMode(EngineState):
    """What an engine's sleep-mode routes do to its state."""

    # --- what the routes answer --------------------------------------------------------------

    @property
    def is_sleeping(self) -> bool:
        """What /is_sleeping answers: the executor's memory asleep, and from 0.17 also a paused
        scheduler (EngineCore.is_sleeping: `is_scheduler_paused() or executor.is_sleeping`)."""
        return bool(self.sleeping_tags) or (self.contract.shared_pause and self.scheduler_paused)

    @property
    def is_paused(self) -> bool:
        """What /is_paused answers: the scheduler's pause (0.17+, so also while asleep), or the
        API server's own flag (0.12 to 0.16, /pause only)."""
        return self.scheduler_paused if self.contract.shared_pause else self.user_paused

    @property
    def sleep_state(self) -> str | None:
        """The `sleep_state` label whose series is 1, as vLLM last recorded it: None when all
        three are 0 (a level-0 sleep, a released KV cache)."""
        level = self.recorded_level
        if level is None:
            return "awake"
        return {1: "weights_offloaded", 2: "discard_all"}.get(level)

    # --- sleep ------------------------------------------------------------------------------

    async def sleep(self, level: int, mode: str) -> int:
        """Sleep at `level`: what the release's /sleep does. Returns the level, which vLLM
        records (gauge, answer) even when its executor, already asleep, ignores it."""
        async with self._admin:
            self.sleep_calls += 1
            with self._operation("sleep"):
                contract = self.contract
                # Requests still running when the memory is unmapped: vllm#45520.
                racing = self.running > 0 and mode != "wait"
                executor = level > 0 or not contract.shared_pause
                if contract.shared_pause or (executor and not self._executor_asleep()):
                    await self._hold(mode if contract.shared_pause else "abort")
                    self.scheduler_paused = contract.shared_pause
                if executor and self._executor_asleep():
                    log.info("%s: executor already sleeping; level %d ignored", self.address, level)
                elif executor:
                    if racing and self._dies_of_racing_sleep():
                        self._crash("a /sleep unmapped memory under requests in flight, vllm#45520")
                        return level  # answered 200 all the same, as vLLM does
                    await self._unmap(level)
                self.recorded_level = level
                await self._notify()
            return level

    def _executor_asleep(self) -> bool:
        """The executor ignores a /sleep while it sleeps: while its weights do from 0.31,
        while anything does before."""
        if self.contract.sleep_checks_weights_tag:
            return WEIGHTS in self.sleeping_tags
        return bool(self.sleeping_tags)

    async def _hold(self, mode: str) -> None:
        """Stop taking requests and deal with those running as `mode` says, then freeze."""
        self._admitting = False
        if mode == "wait":
            async with self._cond:
                await self._cond.wait_for(lambda: self.running == 0)
        elif mode == "abort":
            for request in self._requests:
                request.aborted = True
        self._paused = True
        await self._notify()

    async def _unmap(self, level: int) -> None:
        """The worker's sleep: level 1 copies the weights to pinned host RAM; any other level
        discards them (before 0.17 level 0 too, and without saving the model's buffers)."""
        await asyncio.sleep(self.sleep_duration(level))
        if not self.config.frees_nothing:
            self.memory.unmap(keep_weights_in_host_ram=level == 1)
        self.sleeping_tags = set(KNOWN_TAGS)
        self.sleep_level = level
        if level != 1:
            self.weights_state = GARBAGE
        if level == 0:
            self.buffers_lost = True

    def _dies_of_racing_sleep(self) -> bool:
        """A parallel engine of a release that unmaps without synchronizing the device."""
        cfg = self.config
        parallel = cfg.tensor_parallel_size > 1 or cfg.pipeline_parallel_size > 1
        return parallel and not self.contract.syncs_before_unmap

    def _crash(self, why: str) -> None:
        log.error("%s: %s (%s); EngineCore died", self.address, ILLEGAL_ACCESS, why)
        self.crashed = True
        # After the answer has gone out: vLLM's answers while the engine dies.
        asyncio.get_running_loop().call_later(0.05, self.on_crash)

    def sleep_duration(self, level: int) -> float:
        """How long a sleep at `level` takes now: a level-1 sleep that finds its pinned blocks
        kept from an earlier one only copies."""
        config = self.config
        if level != 1:
            return config.level2_sleep_seconds
        if self.memory.pinned_bytes >= self.memory.part_bytes[WEIGHTS]:
            return config.sleep_seconds * (1 - config.pinning_share)
        return config.sleep_seconds

    # --- wake -------------------------------------------------------------------------------

    async def wake_up(self, tags: list[str] | None) -> bool:
        """Wake the given parts (None: everything); True once the executor's memory is all
        back (and from 0.17 the scheduler resumed, which also ends a /pause).

        As vLLM's executor: a tag that is not asleep makes the whole call a no-op (a warning);
        a part that finds no room on the device fails the call (HTTP 500), parts mapped before
        it stay mapped, and the engine stays asleep until a wake succeeds. Before 0.8.3 the
        tags are not read: everything wakes.
        """
        async with self._admin:
            self.wake_calls += 1
            contract = self.contract
            if not contract.wake_tags:
                tags = None
            elif contract.shared_pause and tags is not None:
                tags = [tag for tag in tags if tag != SCHEDULING] or None
                if tags is None:
                    tags = []  # only the scheduler: nothing for the executor
            with self._operation("wake"):
                if tags != [] and self.sleeping_tags:
                    await self._wake_executor(tags)
                fully_awake = not self.sleeping_tags
                if fully_awake:
                    self.sleep_level = 0
                    self._spoil_on_wake()
                    if not contract.shared_pause:
                        self._paused = self.user_paused
                        self._admitting = not self.user_paused
                # Before 0.31 any wake, partial or not, resumes the scheduler (0.17+) and is
                # recorded as awake: a partly woken engine then runs requests on the memory
                # still asleep.
                whole = fully_awake or not contract.waits_for_a_full_wake
                if whole and contract.shared_pause:
                    self._resume_scheduler()
                if whole:
                    self.recorded_level = None
                await self._notify()
            return fully_awake

    async def _wake_executor(self, tags: list[str] | None) -> None:
        asleep = self.sleeping_tags
        if tags is not None and not set(tags) <= asleep:
            log.warning(
                "%s: wake-up tags %s not all in sleeping tags %s",
                self.address,
                tags,
                sorted(asleep),
            )
            return
        wanted = asleep if tags is None else set(tags)
        for part in KNOWN_TAGS:  # in allocation order, as CuMemAllocator maps them
            if part in wanted:
                await self._bring_back(part)
        self.sleeping_tags = asleep - wanted

    def _resume_scheduler(self) -> None:
        """EngineCore.resume_scheduler: the one pause state cleared, whoever paused it."""
        self.scheduler_paused = self.user_paused = self.reject_new = False
        self._paused = False
        self._admitting = True

    def _spoil_on_wake(self) -> None:
        """The failures a wake can leave behind, when the engine is made to have them."""
        if self.config.wake_corrupts_weights and self.weights_state == INTACT:
            self.weights_state = WRONG_WEIGHTS
        if self.config.wake_changes_output:
            self.answers_off = True

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

    async def release_kv_cache(self) -> None:
        """/release_kv_cache_memory (0.31+): the KV cache discarded, once a pause has
        completed and everything is resident; vLLM records it as a sleep at level 0."""
        async with self._admin:
            with self._operation("release_kv_cache_memory"):
                if not self.scheduler_paused or self.running or self.sleeping_tags:
                    raise WakeError(f"RuntimeError: {KV_RELEASE_NEEDS_PAUSE}")
                self.memory.discard(KV_CACHE)
                self.sleeping_tags = {KV_CACHE}
                self.recorded_level = 0

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
            self.scheduler_paused = self.contract.shared_pause
            self.reject_new = self.contract.pause_rejects_new and mode != "keep"
            await self._notify()

    async def resume(self) -> None:
        """/resume. From 0.17 it resumes the one scheduler, even while the executor sleeps:
        the next step then runs on memory sleep unmapped."""
        async with self._admin:
            if self.contract.shared_pause:
                self._resume_scheduler()
            else:
                self.user_paused = self.reject_new = False
                if not self.is_sleeping:
                    self._paused = False
                    self._admitting = True
            await self._notify()

    # --- weights (/weight_checker) -------------------------------------------------------------

    async def weight_checksums(self) -> dict[str, str]:
        """What vLLM's compute_weight_checksums gives: a digest per tensor and rank. It takes
        the time of copying and hashing one rank's share of the weights, during which the
        engine generates nothing (a utility call holds its busy loop). vLLM does not look
        whether the weights are mapped: on an engine whose weights sleep, the copy reads
        unmapped memory, the call fails and the engine core dies of it."""
        async with self._admin:
            self.checksum_calls += 1
            if not self.weights_on_gpu:
                self._crash("/weight_checker read the weights while they sleep")
                raise WakeError(f"Call to compute_weight_checksums method failed: {ILLEGAL_ACCESS}")
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
                layers=cfg.num_layers,
                tensor_parallel=cfg.tensor_parallel_size,
                pipeline_parallel=cfg.pipeline_parallel_size,
                state=self.weights_state,
            )

    async def reset_weights(self) -> None:
        """/weight_checker's reset: every weight zeroed (answers are garbage until a reload)."""
        async with self._admin:
            self.weights_state = ZEROED

    def _operation(self, name: str) -> _Timed:
        return _Timed(self, name)


class _Timed:
    """Counts a sleep-mode operation in flight and records its duration, as vLLM 0.32+ does:
    each operation's series exists from its first use."""

    def __init__(self, engine: EngineState, name: str) -> None:
        self._engine = engine
        self._name = name
        self._started = 0.0

    def __enter__(self) -> None:
        self._started = time.monotonic()
        engine = self._engine
        engine.ops_in_flight[self._name] = engine.ops_in_flight.get(self._name, 0) + 1
        engine.op_durations.setdefault(self._name, Histogram.sleep_ops())

    def __exit__(self, *exc: object) -> None:
        self._engine.ops_in_flight[self._name] -= 1
        self._engine.op_durations[self._name].observe(time.monotonic() - self._started)
