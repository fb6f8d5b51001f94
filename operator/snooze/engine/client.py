"""An async client for one vLLM engine's sleep, wake, health and activity endpoints."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Collection
from typing import Any

from snooze.engine.activity import (
    ACTIVITY_METRICS,
    METRICS_LIMIT,
    PROBE_METRICS,
    RUNNING,
    WAITING,
    ActivityReader,
    ActivitySnapshot,
    SleepState,
    parse_activity,
)
from snooze.engine.errors import (
    EngineError,
    EngineHTTPError,
    EngineTimeoutError,
    InvalidAnswerError,
    classify_answer,
)
from snooze.engine.http import ANSWER_LIMIT, Answer, EngineHttp, Params, Sink
from snooze.engine.metricspath import Query
from snooze.engine.overhttp import OverHttp

__all__ = [
    "ACTIVITY_METRICS",
    "ActivitySnapshot",
    "EngineClient",
    "EngineHttp",
    "SleepState",
    "new_http_client",
    "parse_activity",
]

SLEEP_MODES = ("abort", "wait", "keep")
# The named steps of a wake (see EngineClient.wake).
WEIGHTS, RELOAD, KV_CACHE = "weights", "reload_weights", "kv_cache"


# How long a sleep or a wake holds one of the shared slots: longer than most take (vLLM's
# published level-1 sleep of 39 GiB, 5.7 s), so that the slots still bound a sleep wave's
# requests, while engines that never answer (or drip their answer) cannot keep the other
# models' sleeps and wakes waiting past it (see EngineHttp's lease).
ACTION_LEASE_SECONDS = 10.0


def new_http_client(*, max_connections: int = 64, lease: float | None = None) -> EngineHttp:
    """Return the HTTP session for `EngineClient`s to share (the operator's sleeps and wakes;
    its probes go through engine/probe.py's Prober). At most `max_connections` requests are
    in flight, each holding its slot at most `lease` seconds (EngineHttp); more wait their
    turn."""
    return EngineHttp(limit=max_connections, lease=lease)


class EngineClient(OverHttp):
    """Talks to one vLLM engine; every method raises only `EngineError` subclasses.

    Pass `client` (from `new_http_client`) to share one session among many engines; then
    `aclose` leaves it open. Without it the engine client owns a private one. `timeout` bounds
    quick calls (health, probes, metrics); `sleep` and `wake` take their own, longer, timeout.
    The client does not retry: the caller owns backoff and knows whether a retry is safe.
    """

    def __init__(
        self,
        base_url: str,
        *,
        client: EngineHttp | None = None,
        timeout: float = 5.0,
    ) -> None:
        super().__init__(base_url, timeout, client, new_http_client)

    async def health(self) -> bool:
        """Return whether the engine is alive: False when it answers 5xx (dead engine core).

        An asleep engine, and one whose wake failed, still answers 200: health alone does not
        say an engine can serve.
        """
        response = await self._request("GET", "/health", ok_statuses=range(500, 600))
        return response.is_success

    async def is_sleeping(self) -> bool:
        """Return whether the engine sleeps (any level, or only partly woken)."""
        data = self._json(await self._request("GET", "/is_sleeping"), "/is_sleeping")
        value = data.get("is_sleeping")
        if not isinstance(value, bool):
            raise self._unreadable("/is_sleeping", 'expected {"is_sleeping": true|false}')
        return value

    # A `timeout` argument, not the caller's asyncio.timeout: it is counted from the request's
    # turn in the shared session, and a wake's budget spans several requests.
    async def sleep(self, level: int, mode: str = "wait", *, timeout: float = 120.0) -> None:  # noqa: ASYNC109
        """Put the engine to sleep at `level` (0 pause, 1 offload weights, 2 discard all).

        `mode` says what happens to requests in flight: `wait` for them (the default here,
        unlike vLLM's `abort`), `abort` them, or `keep` them paused (0.17+; earlier releases
        ignore `mode`, so drain first). An engine that already sleeps ignores this: wake it
        before changing level.
        """
        if level not in (0, 1, 2):
            raise ValueError(f"sleep level must be 0, 1 or 2, not {level!r}")
        if mode not in SLEEP_MODES:
            raise ValueError(f"sleep mode must be one of {', '.join(SLEEP_MODES)}, not {mode!r}")
        await self._request("POST", "/sleep", params={"level": level, "mode": mode}, budget=timeout)

    async def wake(
        self,
        level: int,
        *,
        timeout: float = 300.0,  # noqa: ASYNC109
        staged: bool = False,
        done: Collection[str] = (),
        on_step: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        """Wake an engine put to sleep at `level`, within `timeout` seconds for the whole sequence.

        Level 2 discarded the weights, so it wakes the weights, reloads them
        (`collective_rpc reload_weights`) and then wakes the KV cache: a plain wake would serve
        garbage. Levels 0 and 1 wake in one call, or weights then KV cache when `staged`
        (lower peak GPU memory). Raises unless the engine ends up awake.

        Steps are named (`weights`, `reload_weights`, `kv_cache`, or `all`); those in `done`
        are skipped (a wake resumed after the caller restarted: a weight reload takes tens of
        seconds on vLLM), and `on_step` is awaited after each step the engine completed, so
        that the caller can record the progress.
        """
        if level not in (0, 1, 2):
            raise ValueError(f"sleep level must be 0, 1 or 2, not {level!r}")
        deadline = time.monotonic() + timeout
        steps: list[tuple[str, str, dict[str, Any]]]
        if level == 2:
            steps = [
                (WEIGHTS, "/wake_up", {"params": {"tags": "weights"}}),
                (RELOAD, "/collective_rpc", {"json": {"method": "reload_weights"}}),
                (KV_CACHE, "/wake_up", {"params": {"tags": "kv_cache"}}),
            ]
        elif staged:
            steps = [
                (WEIGHTS, "/wake_up", {"params": {"tags": "weights"}}),
                (KV_CACHE, "/wake_up", {"params": {"tags": "kv_cache"}}),
            ]
        else:
            steps = [("all", "/wake_up", {})]
        response: Answer | None = None
        for name, path, kwargs in steps:
            if name in done and name != steps[-1][0]:
                continue  # the last step always runs: its answer says whether the engine woke
            during = f"waking up from level {level} (at {path})"
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._timed_out(path, timeout, during=during)
            try:
                response = await self._request("POST", path, budget=remaining, **kwargs)
            except EngineTimeoutError as error:
                # Report the caller's budget for the whole sequence, not this step's remainder.
                raise self._timed_out(path, timeout, during=during) from error
            if on_step is not None:
                await on_step(name)
        assert response is not None
        # 0.32+ says where the wake left the engine; earlier releases answer an empty body.
        status = self._json(response, "/wake_up").get("status") if response.body.strip() else None
        still_sleeping = status == "sleeping" if status is not None else await self.is_sleeping()
        if still_sleeping:
            raise EngineHTTPError(
                f"{self.base_url} still sleeps after a level-{level} wake-up answered "
                f"{response.status}. Read the engine's log; restart the pod if it persists.",
                url=self.base_url + "/wake_up",
                status=response.status,
                message="still sleeping after wake-up",
            )

    async def activity(self) -> ActivitySnapshot:
        """Return the engine's request gauges, success counter and sleep state in one scrape.

        One small filtered scrape per probe, so that thousands of engines stay cheap to watch
        (through the path that filters: engine/metricspath.py).
        """
        paths = self._client.metrics_paths
        snapshot = await paths.activity(self.base_url, PROBE_METRICS, self._scrape)
        if snapshot is None:
            raise self._unreadable("/metrics", f"no {RUNNING} or {WAITING} in the payload")
        return snapshot

    async def _scrape(self, path: str, params: Query) -> ActivitySnapshot | None:
        reader = ActivityReader()  # a chunk at a time, nothing kept (engine/probe.py)
        try:
            await self._request("GET", path, params=params, limit=METRICS_LIMIT, sink=reader.feed)
            return reader.result()
        except ValueError as error:
            raise self._unreadable(path, str(error)) from error

    async def _request(
        self,
        method: str,
        path: str,
        *,
        budget: float | None = None,
        ok_statuses: range | None = None,
        params: Params = None,
        json: Any = None,
        limit: int = ANSWER_LIMIT,
        sink: Sink | None = None,
    ) -> Answer:
        """Send one request with a total deadline, read at most `limit` bytes of its answer
        (to `sink`, if given), and turn every failure into an EngineError."""
        response = await self._send(
            method, path, budget=budget, params=params, json=json, limit=limit, sink=sink
        )
        if response.is_success or (ok_statuses is not None and response.status in ok_statuses):
            return response
        url = self.base_url + path
        raise classify_answer(response.status, response.text, url=url, path=path)

    def _unreadable(self, path: str, what: str, *, status: int = 200) -> EngineError:
        return InvalidAnswerError(
            f"{self.base_url}{path} answered something the client cannot read or believe "
            f"({what}). Is this port a vLLM engine?",
            url=self.base_url + path,
            status=status,
            message=what,
        )

    def _timed_out(self, path: str, timeout: float, *, during: str = "") -> EngineError:
        doing = during or f"answering {path}"
        return EngineTimeoutError(
            f"{self.base_url} took longer than {timeout:g}s {doing}. It may still be working: "
            "ask /is_sleeping before retrying, and raise the timeout if the model is large.",
            url=self.base_url + path,
        )
