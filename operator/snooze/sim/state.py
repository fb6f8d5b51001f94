"""The state of one simulated vLLM engine: its memory on the device, its requests, its start and
its death; what its routes do with it is in sim/sleepmode.py and sim/engine.py."""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from snooze.sim.config import EngineConfig
from snooze.sim.contract import Contract
from snooze.sim.device import KV_CACHE, WEIGHTS, DeviceShare, SimulatedDevice
from snooze.sim.histograms import Histogram, request_histograms
from snooze.sim.outputs import INTACT

log = logging.getLogger(__name__)


class EngineDead(Exception):
    """The engine was killed: its requests end without an answer."""


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


class EngineState:
    """One engine's state and memory, and its start; sim/sleepmode.py and sim/engine.py add what
    its routes do with them. Its coroutines run in the loop that serves it."""

    def __init__(self, config: EngineConfig, device: SimulatedDevice | None = None) -> None:
        self.config = config
        self.contract = Contract(config.vllm_version)
        self.port = config.port
        self.sleep_level = 0
        """The level the executor slept at while its memory sleeps; 0 otherwise."""
        self.sleeping_tags: set[str] = set()
        """As vLLM's executor: the parts asleep, which a wake must bring back."""
        self.scheduler_paused = False
        """vLLM 0.17+: the engine core's scheduler is paused, by a sleep or by /pause."""
        self.recorded_level: int | None = None
        """The sleep level vLLM last recorded for its sleep-state gauge; None: awake."""
        self.buffers_lost = False
        """A level-0 sleep before 0.17 discarded the model's buffers too: its answers stay
        garbage, even after a weight reload, until the process restarts."""
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
        self.ops_in_flight: dict[str, int] = {}
        """Sleep-mode operations under way, by operation; each appears at its first use."""
        self.op_durations: dict[str, Histogram] = {}
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
