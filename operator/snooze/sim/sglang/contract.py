"""What a simulated SGLang server's HTTP contract is, release by release, as read in SGLang's
released wheels (docs/sglang.md gives each release and the file it was read in).

The simulator imports nothing of the operator's, so it reads versions itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_SGLANG_VERSION = "0.5.23"
OLDEST_SGLANG = (0, 4, 9)
"""The oldest release the simulator speaks for: /pause_generation, which holds new requests
while the memory is released, appeared in 0.4.9 (release by tags in 0.4.8)."""
WEIGHTS, KV_CACHE, CUDA_GRAPH = "weights", "kv_cache", "cuda_graph"
# A release such as 0.5.15.post1 or v0.5.23: its post suffix does not change the contract.
_RELEASE = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?(?:\.post\d+)?$")


def parse_sglang_release(version: str) -> tuple[int, int, int]:
    """`0.5.23` as (0, 5, 23); ValueError naming what is accepted otherwise."""
    match = _RELEASE.match(version.strip())
    if match is None:
        raise ValueError(f"not an SGLang release: {version!r} (give one such as 0.5.23)")
    major, minor, patch = match.groups()
    release = int(major), int(minor), int(patch or 0)
    if release < OLDEST_SGLANG:
        raise ValueError(
            f"SGLang {version} predates /pause_generation (0.4.9), without which a request "
            "reaches a released engine"
        )
    return release


@dataclass(frozen=True)
class SGLangContract:
    """The routes and answers of one SGLang release, for the parts the simulator serves."""

    version: str = DEFAULT_SGLANG_VERSION

    @property
    def release(self) -> tuple[int, int, int]:
        return parse_sglang_release(self.version)

    def _since(self, *first: int) -> bool:
        return self.release >= first

    @property
    def all_tags(self) -> tuple[str, ...]:
        """What a release without tags frees: weights and KV cache, and from 0.5.5 the CUDA
        graphs too (constants.py GPU_MEMORY_ALL_TYPES)."""
        if self._since(0, 5, 5):
            return (KV_CACHE, WEIGHTS, CUDA_GRAPH)
        return (WEIGHTS, KV_CACHE)

    @property
    def empty_tags_mean_all(self) -> bool:
        """`{"tags": []}` frees everything from 0.5.1; before, only a missing list does, and an
        empty one frees nothing (`if tags is None`, managers/scheduler.py)."""
        return self._since(0, 5, 1)

    @property
    def resume_checks_tags(self) -> bool:
        """0.5.1+: the scheduler keeps the released tags (offload_tags) and a resume of one
        not released raises KeyError, which kills the server."""
        return self._since(0, 5, 1)

    @property
    def release_asserts_idle(self) -> bool:
        """0.5.5+: release asserts an idle scheduler; the AssertionError kills the server
        (run_scheduler_process sends SIGQUIT to its parent)."""
        return self._since(0, 5, 5)

    @property
    def release_ignores_paused_queue(self) -> bool:
        """0.5.21+: a scheduler paused by /pause_generation may hold waiting (retracted)
        requests at release (weight_updater.py, ignore_waiting)."""
        return self._since(0, 5, 21)

    @property
    def pause_modes(self) -> bool:
        """/pause_generation takes `{"mode": "abort"|"retract"|"in_place"}` from 0.5.6; before,
        it takes no body and aborts every request."""
        return self._since(0, 5, 6)

    @property
    def weights_cpu_backup(self) -> bool:
        """--enable-weights-cpu-backup, 0.5.3+: released weights keep a host copy."""
        return self._since(0, 5, 3)

    @property
    def server_info(self) -> bool:
        """/server_info and /model_info, 0.5.6+ (/get_server_info and /get_model_info before,
        and kept after as deprecated aliases)."""
        return self._since(0, 5, 6)

    @property
    def weights_checker(self) -> bool:
        """/weights_checker, 0.5.6+ (snapshot, reset_tensors, compare)."""
        return self._since(0, 5, 6)

    @property
    def checksum_action(self) -> bool:
        """/weights_checker `{"action": "checksum"}`, 0.5.12+ (utils/weight_checker.py)."""
        return self._since(0, 5, 12)

    @property
    def per_engine_checksum(self) -> bool:
        """The checksum answer's `per_engine_checksum`, 0.5.13+."""
        return self._since(0, 5, 13)

    @property
    def admin_api_key(self) -> bool:
        """--admin-api-key, 0.5.8+ (utils/auth.py): the admin routes take it instead of
        --api-key."""
        return self._since(0, 5, 8)

    @property
    def health_generation_switch(self) -> bool:
        """SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false makes /health answer at once, 0.5.8+;
        before, /health always generates one token."""
        return self._since(0, 5, 8)

    @property
    def ready_route(self) -> bool:
        """GET /ready, 0.5.20+: 503 while paused or unhealthy."""
        return self._since(0, 5, 20)

    @property
    def scheduler_rank_labels(self) -> bool:
        """The scheduler's metrics carry tp_rank and pp_rank (0.5.4+; model_name and
        engine_type before)."""
        return self._since(0, 5, 4)
