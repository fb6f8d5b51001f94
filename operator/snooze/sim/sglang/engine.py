"""The state of one simulated SGLang server: memory released and resumed by tag, generation
paused and continued, and the ways the real one dies (docs/sglang.md cites each)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from snooze.api import enginetimes
from snooze.sim import outputs
from snooze.sim.device import KV_CACHE, WEIGHTS, SimulatedDevice
from snooze.sim.engine import EngineConfig, EngineDead, Request, SimulatedEngine
from snooze.sim.outputs import GARBAGE, INTACT
from snooze.sim.sglang.contract import (
    CUDA_GRAPH,
    DEFAULT_SGLANG_VERSION,
    SGLangContract,
)

log = logging.getLogger(__name__)

PAUSE_MODES = ("abort", "retract", "in_place")
# The messages the real server logs as it dies, by cause (the process tree is killed: the HTTP
# request that caused it gets no answer).
BUSY_RELEASE = (
    "AssertionError: release_memory_occupation should be called only when server is idle."
)
UNMAPPED = "CUDA error: an illegal memory access was encountered"
NOT_PAUSED = "KeyError: {tag!r}"
"""0.5.1+: resume removes each tag from the released ones (offload_tags.remove)."""
PAUSED_TWICE = "[torch_memory_saver.cpp] Cannot pause allocation that is not active."
NO_SAVER = (
    "`release_memory_occupation` will not save memory because torch_memory_saver is not "
    "enabled. Potential causes: `enable_memory_saver` is false, or torch_memory_saver has "
    "installation issues."
)


@dataclass(frozen=True, kw_only=True)
class SGLangConfig(EngineConfig):
    """An SGLang server (`python -m sglang.launch_server`): what its flags and release make it
    do. The timings of EngineConfig mean here: `sleep_seconds` a release that copies the
    weights to host RAM (--enable-weights-cpu-backup), `level2_sleep_seconds` one that drops
    them, `wake_seconds` and `kv_wake_seconds` a resume of each, `reload_seconds` an
    /update_weights_from_disk."""

    sleep_seconds: float = enginetimes.SGLANG_RELEASE_SECONDS
    level2_sleep_seconds: float = enginetimes.SGLANG_DROP_SECONDS
    wake_seconds: float = enginetimes.SGLANG_RESUME_SECONDS
    reload_seconds: float = enginetimes.SGLANG_RELOAD_SECONDS
    sglang_version: str = DEFAULT_SGLANG_VERSION
    """The SGLang release whose HTTP contract it speaks (sim/sglang/contract.py)."""
    memory_saver: bool = True
    """--enable-memory-saver; without it a release answers 200 and frees nothing."""
    weights_cpu_backup: bool = False
    """--enable-weights-cpu-backup (0.5.3+): released weights keep a host copy; without it a
    resume brings back memory whose contents are lost, until /update_weights_from_disk."""
    metrics: bool = True
    """--enable-metrics: without it /metrics is 404."""
    api_key: str | None = None
    """--api-key: every route but /health, /ready and /metrics wants it."""
    admin_api_key: str | None = None
    """--admin-api-key (0.5.8+): the admin routes want it, and no longer --api-key."""
    health_generation: bool = True
    """SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION (0.5.8+; always on before): /health generates
    one token, so it waits while generation is paused."""
    health_timeout_seconds: float = 20.0
    """SGLANG_HEALTH_CHECK_TIMEOUT: how long /health waits before 503 (and marks the server
    unhealthy)."""
    release_lag_seconds: float = 0.0
    """The release answers this long before its memory is back on the device (with tensor
    parallelism the answer comes from rank 0, and no barrier waits for the other ranks)."""
    model_path: str = ""
    """--model-path (default: the served model name), what /update_weights_from_disk reloads."""


class SGLangEngine(SimulatedEngine):
    """One SGLang server's state; its coroutines run in the loop that serves it."""

    config: SGLangConfig

    def __init__(self, config: SGLangConfig, device: SimulatedDevice | None = None) -> None:
        super().__init__(config, device)
        self.sglang = SGLangContract(config.sglang_version)
        self.released: set[str] = set()
        """The tags released and not resumed (the scheduler's offload_tags)."""
        self.generation_paused = False
        """/pause_generation was called and /continue_generation not yet: new requests wait
        in the tokenizer, and /health with them."""
        self.scheduler_pause: str | None = None
        """in_place or retract while the scheduler itself is paused (0.5.6+)."""
        self.retracted: set[Request] = set()
        self.held = 0
        """Requests waiting for /continue_generation before the scheduler sees them."""
        self.unhealthy = False
        self.weights_lost = False
        """Released without a host copy: a resume brings back memory, not the weights."""
        self.calls: dict[str, int] = {}
        """Admin calls received, by route."""
        self.death: str | None = None
        """Why the server died, as it logged it."""
        self._freeing: asyncio.Task[None] | None = None

    @property
    def is_sleeping(self) -> bool:
        """SGLang has no sleep state of its own: asleep is some memory released and not
        resumed (what the simulator's shared parts read as asleep)."""
        return bool(getattr(self, "released", ()))

    @property
    def model_path(self) -> str:
        return self.config.model_path or self.config.model

    @property
    def running_in_scheduler(self) -> int:
        """Requests in the running batch (retracted ones wait again)."""
        return self.running - len(self.retracted)

    @property
    def queued_in_scheduler(self) -> int:
        """Requests in the scheduler's waiting queue (those held at the pause are not)."""
        return self.waiting + len(self.retracted)

    def count(self, route: str) -> None:
        self.calls[route] = self.calls.get(route, 0) + 1

    # --- dying ---------------------------------------------------------------------------------

    def die(self, why: str) -> None:
        """The scheduler raised: it sends SIGQUIT to its parent, which kills the process tree
        (run_scheduler_process). The request that caused it gets no answer."""
        log.error("%s: Scheduler hit an exception: %s; killing the process tree", self.address, why)
        self.death = why
        self.crashed = True
        asyncio.get_running_loop().call_soon(self.on_crash)
        raise EngineDead(self.address)

    def kill(self) -> None:
        super().kill()
        if self._freeing is not None:
            self._freeing.cancel()

    # --- inference -----------------------------------------------------------------------------

    async def admit(self, request: Request) -> None:
        """Hold a request in the tokenizer while generation is paused, then queue it."""
        if self.generation_paused:
            self.held += 1
            try:
                async with self._cond:
                    await self._cond.wait_for(lambda: self.dead or not self.generation_paused)
            finally:
                self.held -= 1
            self._check(request)
        await super().admit(request)
        if request.admitted and self._unmapped():
            # A request that reaches a scheduler whose memory is released runs on it.
            self.die(UNMAPPED)

    def _unmapped(self) -> bool:
        return self.config.memory_saver and bool(self.released & {WEIGHTS, KV_CACHE})

    # --- /pause_generation, /continue_generation --------------------------------------------------

    async def pause_generation(self, mode: str) -> None:
        """Hold new requests in the tokenizer; abort those in the engine (`abort`, and every
        pause before 0.5.6), freeze them where they are (`in_place`) or put them back in the
        waiting queue (`retract`)."""
        async with self._admin:
            self.generation_paused = True
            self._admitting = False
            if mode == "abort":
                for request in self._requests:
                    request.aborted = True
                # The tokenizer waits for the aborted requests to end before it answers.
                async with self._cond:
                    await self._cond.wait_for(lambda: self.running == 0)
                self._admitting = True  # the scheduler itself is not paused
            else:
                self.scheduler_pause = mode
                self._paused = True
                if mode == "retract":
                    self.retracted = {r for r in self._requests if r.admitted}
            await self._notify()

    async def continue_generation(self) -> None:
        async with self._admin:
            self.generation_paused = False
            self.scheduler_pause = None
            self.retracted = set()
            self._paused = False
            self._admitting = True
            await self._notify()
        if self.running and self._unmapped():
            self.die(UNMAPPED)

    # --- /release_memory_occupation, /resume_memory_occupation ----------------------------------

    def tags_of(self, tags: list[str] | None) -> list[str]:
        """The tags a call acts on: all the release knows when none are given."""
        if tags is None or (not tags and self.sglang.empty_tags_mean_all):
            return list(self.sglang.all_tags)
        return list(tags)

    async def release_memory(self, tags: list[str] | None) -> None:
        """Release the tagged memory, as the scheduler does; the ways it dies included."""
        async with self._admin:
            wanted = self.tags_of(tags)
            busy = self.running_in_scheduler > 0
            queued = self.queued_in_scheduler > 0 and not (
                self.scheduler_pause is not None and self.sglang.release_ignores_paused_queue
            )
            if self.sglang.release_asserts_idle and (busy or queued):
                self.die(BUSY_RELEASE)
            if busy and self.config.memory_saver:
                self.die(UNMAPPED)  # unmapped under the running batch's kernels
            saver = self.config.memory_saver
            if saver and any(t in self.released for t in wanted if t != CUDA_GRAPH):
                self.die(PAUSED_TWICE)
            if not saver:
                log.warning("%s: %s", self.address, NO_SAVER)
            self.released |= set(wanted)
            self.sleep_calls += 1
            with self._operation("sleep"):
                parts = [p for p in (KV_CACHE, WEIGHTS) if p in wanted]
                keep = self.config.weights_cpu_backup and self.sglang.weights_cpu_backup
                seconds = self.config.sleep_seconds if keep else self.config.level2_sleep_seconds
                await asyncio.sleep(seconds if WEIGHTS in parts else 0.0)
                if saver and parts:
                    if WEIGHTS in parts and not keep:
                        self.weights_lost = True
                    if self.config.release_lag_seconds > 0:
                        self._freeing = asyncio.get_running_loop().create_task(
                            self._free_later(parts, keep)
                        )
                    else:
                        self._free(parts, keep)

    async def _free_later(self, parts: list[str], keep: bool) -> None:
        await asyncio.sleep(self.config.release_lag_seconds)
        self._free(parts, keep)

    def _free(self, parts: list[str], keep: bool) -> None:
        memory = self.memory
        for part in parts:
            if part in memory.on_gpu:
                memory.device.release(memory, memory.part_bytes[part])
                memory.on_gpu.discard(part)
        if WEIGHTS in parts and keep:
            memory.weights_in_host_ram = True
            memory.pinned_bytes = max(memory.pinned_bytes, memory.part_bytes[WEIGHTS])

    async def resume_memory(self, tags: list[str] | None) -> None:
        """Map the tagged memory again (CUDA graphs, weights, then KV cache, as the scheduler
        does); a tag not released kills the server (0.5.1+), as does a device without room."""
        async with self._admin:
            wanted = self.tags_of(tags)
            if self.sglang.resume_checks_tags:
                for tag in wanted:
                    if tag not in self.released:
                        self.die(NOT_PAUSED.format(tag=tag))
            if self._freeing is not None:
                await self._freeing  # the other ranks finish freeing before they map again
                self._freeing = None
            self.wake_calls += 1
            with self._operation("wake"):
                for part in (WEIGHTS, KV_CACHE):
                    if part not in wanted or not self.config.memory_saver:
                        continue
                    if part not in self.memory.on_gpu:
                        if not self.memory.map_again(part):
                            self.die("torch_memory_saver: CUDA error: out of memory (cuMemCreate)")
                        cfg = self.config
                        await asyncio.sleep(
                            cfg.wake_seconds if part == WEIGHTS else cfg.kv_wake_seconds
                        )
                    if part == WEIGHTS:
                        self.memory.weights_in_host_ram = False
                        if self.weights_lost:
                            self.weights_state = GARBAGE
                self.released -= set(wanted)

    # --- /update_weights_from_disk, /weights_checker --------------------------------------------

    async def update_weights_from_disk(self, model_path: str) -> tuple[bool, str]:
        """Load the weights again into their (mapped) memory."""
        async with self._admin:
            self.count("update_weights_from_disk")
            if self.config.memory_saver and WEIGHTS in self.released:
                self.die(UNMAPPED)  # written into memory that is not mapped
            if model_path != self.model_path:
                return False, (
                    f"Failed to get weights iterator: {model_path} (repository not found)."
                )
            await asyncio.sleep(self.config.reload_seconds)
            self.weights_state = INTACT
            self.weights_lost = False
            return True, "Succeeded to update model weights."

    async def checksums(self) -> list[dict[str, str]]:
        """The `checksum` action: a digest per tensor, one map per tensor-parallel rank (it
        reads the weights' memory, released or not)."""
        async with self._admin:
            self.checksum_calls += 1
            if self._unmapped() and WEIGHTS in self.released:
                self.die(UNMAPPED)
            cfg = self.config
            await asyncio.sleep(cfg.checksum_seconds_per_gib * cfg.gpu_memory_gib)
            vllm_style = outputs.checksums(
                cfg.model,
                layers=cfg.num_layers,
                tensor_parallel=cfg.tensor_parallel_size,
                pipeline_parallel=1,
                state=self.weights_state,
            )
            ranks: list[dict[str, str]] = [{} for _ in range(cfg.tensor_parallel_size)]
            for key, digest in vllm_style.items():
                rank = int(key.split(":")[3][2:])
                # SGLang hashes each tensor to 16 hex digits (mm_utils.tensor_hash).
                ranks[rank][key.rsplit(":", 1)[1]] = digest[:16]
            return ranks

    # --- /health ---------------------------------------------------------------------------------

    async def health(self) -> bool:
        """/health: a one-token generation unless it is switched off (0.5.8+); it waits for a
        paused server, and after the timeout answers 503 and marks the server unhealthy."""
        generates = self.config.health_generation or not self.sglang.health_generation_switch
        if not generates:
            return True
        if self.generation_paused:
            try:
                async with asyncio.timeout(self.config.health_timeout_seconds):
                    async with self._cond:
                        await self._cond.wait_for(lambda: self.dead or not self.generation_paused)
            except TimeoutError:
                log.error("%s: Health check failed (generation is paused)", self.address)
                self.unhealthy = True
                return False
        if self.dead:
            return False
        if self._unmapped():
            self.die(UNMAPPED)
        self.unhealthy = False
        return True

    @property
    def ready(self) -> bool:
        """/ready (0.5.20+): up and not paused."""
        return self.loaded and not self.generation_paused and not self.unhealthy
