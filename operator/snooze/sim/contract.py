"""What a simulated engine's HTTP contract is, release by release, as read in vLLM's released
wheels (docs/vllm-contract.md gives each release and the file it was read in).

The simulator imports nothing of the operator's, so it reads versions itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_VERSION = "0.33.0"
OLDEST = (0, 8, 0)
"""The oldest release the simulator speaks for: /is_sleeping appeared in 0.8.0."""
NEWEST_READ = (0, 34, 0)
"""The newest release whose wheel was read: a later one is spoken as this one is."""
DETAIL, FLAT, NESTED = "detail", "flat", "nested"
"""The shapes of an error body: FastAPI's `{"detail": ...}`, vLLM's ErrorResponse before
0.10.1 (`{"object": "error", "message": ...}`), and from it (`{"error": {"message": ...}}`)."""
_RELEASE = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?$")


def unread(version: str) -> str | None:
    """What to tell of a release newer than any read (None for one within the range read)."""
    if parse_release(version) <= NEWEST_READ:
        return None
    newest = ".".join(map(str, NEWEST_READ))
    return (
        f"vLLM {version} was not read: it is simulated as {newest} is, the newest release "
        f"read (docs/vllm-contract.md)"
    )


def parse_release(version: str) -> tuple[int, int, int]:
    """`0.33.0` as (0, 33, 0); ValueError naming what is accepted otherwise."""
    match = _RELEASE.match(version.strip())
    if match is None:
        raise ValueError(f"not a vLLM release: {version!r} (give one such as 0.33.0)")
    major, minor, patch = match.groups()
    release = int(major), int(minor), int(patch or 0)
    if release < OLDEST:
        raise ValueError(f"vLLM {version} predates sleep mode's HTTP routes (0.8.0)")
    return release


@dataclass(frozen=True)
class Contract:
    """The routes and answers of one vLLM release, for the parts the simulator serves."""

    version: str = DEFAULT_VERSION

    @property
    def release(self) -> tuple[int, int, int]:
        return parse_release(self.version)

    def _since(self, *first: int) -> bool:
        return self.release >= first

    @property
    def wake_tags(self) -> bool:
        """/wake_up reads its `tags`, 0.8.3+; before, it wakes everything whatever is asked
        (0.8.2 `entrypoints/openai/api_server.py`: `wake_up()` takes no argument)."""
        return self._since(0, 8, 3)

    @property
    def metrics_route_filters(self) -> bool:
        """GET /metrics honours `name[]` up to 0.8.4: it is prometheus_client's app, mounted on
        every path under /metrics. From 0.8.5 the instrumentator's own GET /metrics is
        registered first and serves the whole page whatever the query (0.8.3 and 0.8.4 add it
        only with several API servers); /metrics/ still reaches the mount, which filters."""
        return not self._since(0, 8, 5)

    @property
    def instrumentator(self) -> bool:
        """prometheus-fastapi-instrumentator's families (http_requests_total...) on the page,
        0.8.5+ (with one API server)."""
        return self._since(0, 8, 5)

    @property
    def http_errors(self) -> str:
        """How an HTTPException the routes raise is answered: FastAPI's own `{"detail": ...}`
        up to 0.8.5, vLLM's handler's flat ErrorResponse from 0.9.0, nested under `error`
        from 0.10.1 (openai/api_server.py, later serve/exception_handling)."""
        if not self._since(0, 9, 0):
            return DETAIL
        return NESTED if self._since(0, 10, 1) else FLAT

    @property
    def error_body(self) -> str:
        """vLLM's own ErrorResponse (validation errors, the OpenAI routes' errors): flat
        (`{"object": "error", "message": ...}`) up to 0.10.0, `{"error": {...}}` from 0.10.1
        (openai/protocol.py). Validation errors are 400 in every release, never FastAPI's 422."""
        return NESTED if self._since(0, 10, 1) else FLAT

    @property
    def server_errors_json(self) -> bool:
        """An exception a route does not catch (a failed wake) answers vLLM's JSON 500 from
        0.18.0 (its Exception handler); before, Starlette's plain `Internal Server Error`."""
        return self._since(0, 18, 0)

    @property
    def shared_pause(self) -> bool:
        """0.17.0+: /sleep pauses the scheduler first and a full wake resumes it, /pause and
        sleep are one scheduler state (`EngineCore.is_sleeping` is paused or asleep,
        `is_paused` is paused for either reason), and level 0 only pauses. Before, /sleep went
        straight to the executor, and level 0 discarded everything as level 2 does, without
        saving the model's buffers (v1/worker/gpu_worker.py: `offload_tags` only at level 1)."""
        return self._since(0, 17, 0)

    @property
    def sleep_checks_weights_tag(self) -> bool:
        """0.31.0+: the executor ignores a /sleep only while its weights sleep; before, while
        anything sleeps (v1/executor/abstract.py)."""
        return self._since(0, 31, 0)

    @property
    def waits_for_a_full_wake(self) -> bool:
        """0.31.0+: a wake resumes the scheduler, and is recorded awake on the sleep-state
        gauge, only once all the memory is back; before, after any wake, partial or a no-op
        (EngineCore.wake_up, AsyncLLM.wake_up)."""
        return self._since(0, 31, 0)

    @property
    def sleep_query_validated(self) -> bool:
        """0.32.0+: /sleep's `level` (0 to 2) and `mode` are declared, and a bad one is a
        validation error (400); before, `int(level)` and the mode are read raw."""
        return self._since(0, 32, 0)

    @property
    def release_kv_cache_memory(self) -> bool:
        """POST /release_kv_cache_memory, 0.31.0+ (serve/dev/sleep/api_router.py)."""
        return self._since(0, 31, 0)

    @property
    def collective_rpc(self) -> bool:
        """POST /collective_rpc (what a level-2 wake's reload_weights goes through), 0.10.2+."""
        return self._since(0, 10, 2)

    @property
    def sleep_state_metric(self) -> bool:
        """vllm:engine_sleep_state (vllm/v1/metrics/loggers.py), 0.11.1+."""
        return self._since(0, 11, 1)

    @property
    def token_ids(self) -> bool:
        """`return_token_ids` on the OpenAI routes (openai/protocol.py), 0.10.2+."""
        return self._since(0, 10, 2)

    @property
    def pause_routes(self) -> bool:
        """/pause, /resume, /is_paused: 0.12.0+ (openai/api_server.py, later serve/rlhf)."""
        return self._since(0, 12, 0)

    @property
    def pause_needs_dev_mode(self) -> bool:
        """0.12.0 to 0.15.x mount them without VLLM_SERVER_DEV_MODE; 0.16.0+ only with it."""
        return self._since(0, 16, 0)

    @property
    def pause_modes(self) -> bool:
        """/pause?mode=abort|wait|keep, 0.16.0+; before, only wait_for_inflight_requests."""
        return self._since(0, 16, 0)

    @property
    def pause_wait_flag(self) -> bool:
        """/pause?wait_for_inflight_requests=true, 0.12.0 to 0.31.x (deprecated from 0.16)."""
        return self.pause_routes and not self._since(0, 32, 0)

    @property
    def pause_rejects_new(self) -> bool:
        """0.33.0+: while paused in abort or wait mode, new requests get 503 at once
        (EngineCore.reject_new_requests); before, they wait until /resume."""
        return self._since(0, 33, 0)

    @property
    def sleep_mode_param(self) -> bool:
        """/sleep?mode=abort|wait|keep, 0.17.0+; before, /sleep reads only its level."""
        return self._since(0, 17, 0)

    @property
    def json_sleep_answers(self) -> bool:
        """/sleep and /wake_up answer JSON from 0.32.0; before, 200 with an empty body."""
        return self._since(0, 32, 0)

    @property
    def sleep_operation_metrics(self) -> bool:
        """vllm:sleep_mode_operation_duration_seconds and ..._in_flight, 0.32.0+."""
        return self._since(0, 32, 0)

    @property
    def weight_info(self) -> bool:
        """GET /weight_info, 0.27.0+."""
        return self._since(0, 27, 0)

    @property
    def weight_checker(self) -> bool:
        """POST /weight_checker, 0.32.0+."""
        return self._since(0, 32, 0)

    @property
    def syncs_before_unmap(self) -> bool:
        """0.25.0+: the worker synchronizes the device before sleep unmaps memory; before,
        a /sleep that meets requests in flight at tensor or pipeline parallel > 1 kills the
        engine (vllm#45520)."""
        return self._since(0, 25, 0)
