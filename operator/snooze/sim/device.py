"""A simulated GPU's memory, shared by the engines placed on it; vLLM's words when it is full."""

from __future__ import annotations

import math
import threading

GIB = 1024**3
WEIGHTS = "weights"
KV_CACHE = "kv_cache"
DEFAULT_GPU_MEMORY_UTILIZATION = 0.92
"""vLLM 0.33's default `--gpu-memory-utilization` (vllm/config/cache.py): the share an engine
alone on its device reports."""
CUDA_DEVICE = "cuda:0"
"""How vLLM names the device in its messages: a container sees the GPU it was given as cuda:0."""
WAKE_OUT_OF_MEMORY = "Call to wake_up method failed: CUDA Error: out of memory at <path>:163"
"""vLLM 0.33's /wake_up 500 when the allocator cannot map memory back: cuMemCreate fails in
csrc/cumem_allocator.cpp (line 163 in the 0.33 wheel), the engine core reports "Call to wake_up
method failed: ...", and the API server's sanitize_message replaces the source path."""


def format_gib(nbytes: int) -> str:
    """GiB as vLLM prints them (vllm/utils/mem_utils.py: `round(b / GiB, 2)`)."""
    return f"{round(nbytes / GIB, 2)}"


def startup_refusal(*, free: int, total: int, utilization: float) -> str:
    """The ValueError vLLM 0.33 raises at start-up (vllm/v1/worker/utils.py, request_memory)."""
    requested = math.ceil(total * utilization)
    return (
        f"Free memory on device {CUDA_DEVICE} ({format_gib(free)}/{format_gib(total)} GiB) on "
        f"startup is less than desired GPU memory utilization ({utilization}, "
        f"{format_gib(requested)} GiB). Decrease GPU memory utilization or reduce GPU memory "
        "used by other processes."
    )


class SimulatedDevice:
    """One GPU's memory: what each engine on it holds, and the allocations it refused.

    `shared` devices are the ones a user declares (several engines on one GPU, as with a shared
    DRA ResourceClaim or time-slicing); an engine placed on no such device gets a private one,
    sized so that its footprint is vLLM's default share. The engines of one device may live in
    several event loops (one per SimulatorHost), hence the lock.
    """

    def __init__(self, *, name: str, memory_gib: float, shared: bool = True) -> None:
        if not memory_gib > 0:
            raise ValueError(f"device {name!r}: memory_gib must be positive, not {memory_gib}")
        self.name = name
        self.total_bytes = int(memory_gib * GIB)
        self.shared = shared
        self.oom_total = 0
        """Allocations refused for want of free memory (starts and wakes of every engine)."""
        self._held: dict[object, int] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        used, total = format_gib(self.used_bytes), format_gib(self.total_bytes)
        return f"SimulatedDevice({self.name!r}, {used}/{total} GiB used)"

    @classmethod
    def private(cls, *, name: str, footprint_bytes: int) -> SimulatedDevice:
        """A device of one engine's own, on which its footprint is vLLM's default share."""
        memory_gib = footprint_bytes / DEFAULT_GPU_MEMORY_UTILIZATION / GIB
        return cls(name=name, memory_gib=max(memory_gib, 1e-9), shared=False)

    @property
    def used_bytes(self) -> int:
        with self._lock:
            return sum(self._held.values())

    @property
    def free_bytes(self) -> int:
        return self.total_bytes - self.used_bytes

    def held_by(self, holder: object) -> int:
        with self._lock:
            return self._held.get(holder, 0)

    def allocate(self, holder: object, nbytes: int) -> bool:
        """Take `nbytes` for `holder` if they are free; otherwise count an out-of-memory."""
        with self._lock:
            if self.total_bytes - sum(self._held.values()) < nbytes:
                self.oom_total += 1
                return False
            self._held[holder] = self._held.get(holder, 0) + nbytes
            return True

    def release(self, holder: object, nbytes: int) -> None:
        with self._lock:
            left = self._held.get(holder, 0) - nbytes
            if left > 0:
                self._held[holder] = left
            else:
                self._held.pop(holder, None)

    def release_all(self, holder: object) -> None:
        """Everything `holder` held: its process is gone."""
        with self._lock:
            self._held.pop(holder, None)


class DeviceShare:
    """One engine's memory on its device, in the parts that vLLM's sleep treats apart.

    The residue (CUDA context, graphs) is taken at start and kept until the process ends; the
    weights and the KV cache are what vLLM's sleep-aware allocator (CuMemAllocator) unmaps on
    sleep and maps again on wake, one tag at a time, each of which can fail for want of room.
    """

    def __init__(
        self,
        device: SimulatedDevice | None,
        *,
        weights_gib: float,
        kv_cache_gib: float,
        residue_gib: float,
        owner: str,
    ) -> None:
        self.part_bytes = {WEIGHTS: int(weights_gib * GIB), KV_CACHE: int(kv_cache_gib * GIB)}
        self.residue_bytes = int(residue_gib * GIB)
        self.device = device or SimulatedDevice.private(
            name=f"{owner}-own", footprint_bytes=self.footprint_bytes
        )
        self.on_gpu: set[str] = set()
        """The parts mapped on the device."""
        self.weights_in_host_ram = False
        """A level-1 sleep copied the weights to pinned host RAM; level 2 keeps no copy."""
        self.pinned_bytes = 0
        """Pinned host RAM the process holds. PyTorch's caching host allocator keeps the blocks
        of the first level-1 copy after the wake frees them, and a later level-1 sleep reuses
        them; they go back to the system only when the process ends."""
        self.oom_total = {"start": 0, "wake": 0}
        """Allocations this engine was refused, by operation."""

    @property
    def footprint_bytes(self) -> int:
        """All of it: what an awake engine holds and what it must find free to start."""
        return self.residue_bytes + sum(self.part_bytes.values())

    @property
    def used_bytes(self) -> int:
        return self.device.held_by(self)

    @property
    def host_bytes(self) -> int:
        return self.pinned_bytes

    @property
    def utilization(self) -> float:
        """The engine's `gpu_memory_utilization`: its footprint over a shared device's memory."""
        if not self.device.shared:
            return DEFAULT_GPU_MEMORY_UTILIZATION
        return self.footprint_bytes / self.device.total_bytes

    def take_all(self) -> str | None:
        """Start: take the whole footprint, or return vLLM's refusal when it is not free."""
        free = self.device.free_bytes
        if not self.device.allocate(self, self.footprint_bytes):
            self.oom_total["start"] += 1
            total = self.device.total_bytes
            return startup_refusal(free=free, total=total, utilization=self.utilization)
        self.on_gpu = {WEIGHTS, KV_CACHE}
        return None

    def map_again(self, part: str) -> bool:
        """Wake one part; False (and an out-of-memory) when the device has no room for it."""
        if not self.device.allocate(self, self.part_bytes[part]):
            self.oom_total["wake"] += 1
            return False
        self.on_gpu.add(part)
        if part == WEIGHTS:
            self.weights_in_host_ram = False
        return True

    def unmap(self, *, keep_weights_in_host_ram: bool) -> None:
        """Sleep at level 1 (weights copied to host RAM) or 2: only the residue stays."""
        for part in self.on_gpu:
            self.device.release(self, self.part_bytes[part])
        self.weights_in_host_ram = keep_weights_in_host_ram and WEIGHTS in self.on_gpu
        if self.weights_in_host_ram:
            self.pinned_bytes = max(self.pinned_bytes, self.part_bytes[WEIGHTS])
        self.on_gpu = set()

    def discard(self, part: str) -> None:
        """Unmap one part and keep no copy (vLLM's release_kv_cache_memory: the KV cache)."""
        if part in self.on_gpu:
            self.device.release(self, self.part_bytes[part])
            self.on_gpu.discard(part)

    def release_all(self) -> None:
        """The process ended: the device gets everything back, host RAM too."""
        self.device.release_all(self)
        self.on_gpu = set()
        self.weights_in_host_ram = False
        self.pinned_bytes = 0
