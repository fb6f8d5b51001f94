"""An async client for one SGLang server: its sleep (pause, check, release by tag) and its wake
(resume, reload where no host copy was kept, continue), the engine interface's SGLang side.

SGLang keeps no sleep state that a client can read (no /is_sleeping, no sleep gauge), and a
resume of memory that was not released, or a release of memory already released, kills the
server. So the client keeps the state itself: what is outstanding (released tags, a pause not
continued), told to its `record` callback before each call that changes it, so that its owner
can keep it where a restart of the operator finds it (the pod's annotation).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import Any

from snooze.api.reasons import FailureReason
from snooze.engine.activity import METRICS_LIMIT, ActivitySnapshot
from snooze.engine.errors import (
    EngineError,
    EngineHTTPError,
    EngineTimeoutError,
    InvalidAnswerError,
    SleepModeDisabledError,
    error_message,
)
from snooze.engine.http import ANSWER_LIMIT, Answer, EngineHttp
from snooze.engine.overhttp import OverHttp
from snooze.engine.sglangfacts import (
    PAUSED,
    PROBE_METRICS,
    WEIGHTS,
    SGLangActivityReader,
    SGLangFacts,
    parse_server_info,
)

Record = Callable[[frozenset[str]], Awaitable[None]]
# Bounds on a /weights_checker answer (a hostile server can send anything): ranks, and
# tensors over all of them (a 70B model at tensor parallel 8 has a few thousand).
MAX_RANKS = 1024
MAX_TENSORS = 200_000
# The named steps of a wake (see SGLangClient.wake), as the vLLM client names its own.
ALL, RELOAD, REST, CONTINUE = "all", "reload_weights", "kv_cache", "continue"


@dataclass(frozen=True)
class _Budget:
    """The deadline of a sleep or a wake (several requests), and the whole it was given."""

    deadline: float
    total: float

    @classmethod
    def of(cls, seconds: float) -> _Budget:
        return cls(time.monotonic() + seconds, seconds)


class RequestsInFlightError(EngineError):
    """Requests were still running in the server after its generation was paused: nothing
    was released (a release with one in the running batch kills an SGLang server)."""

    reason = FailureReason.REQUESTS_IN_FLIGHT


class SGLangClient(OverHttp):
    """Talks to one SGLang server; every method raises only `EngineError` subclasses.

    `outstanding` is what its owner recorded as released or paused on the server (tags, and
    `paused`); `record` is awaited with the new set before every call that changes it (and
    after a call that failed with the server's answer that it did not). The client does not
    retry: the caller owns backoff.
    """

    kind = "sglang"

    def __init__(
        self,
        base_url: str,
        *,
        client: EngineHttp | None = None,
        timeout: float = 5.0,
        outstanding: Collection[str] = (),
        record: Record | None = None,
        facts: SGLangFacts | None = None,
    ) -> None:
        super().__init__(base_url, timeout, client, lambda: EngineHttp(limit=8))
        self.outstanding: frozenset[str] = frozenset(outstanding)
        self._record = record
        self._facts = facts

    # --- what the server says -------------------------------------------------------------------

    async def facts(self) -> SGLangFacts:
        """Its arguments and release, from /server_info (/get_server_info before 0.5.6)."""
        if self._facts is None:
            answer = await self._request("GET", "/server_info", allow_404=True)
            path = "/server_info"
            if answer.status == 404:
                path = "/get_server_info"
                answer = await self._request("GET", path)
            try:
                self._facts = parse_server_info(self._json(answer, path))
            except ValueError as error:
                raise self._unreadable(path, str(error)) from error
        return self._facts

    async def activity(self) -> ActivitySnapshot:
        """Requests running and queued in its scheduler, and requests finished so far."""
        query = [("name[]", name) for name in PROBE_METRICS]
        for params in (query, None):
            reader = SGLangActivityReader()
            answer = await self._request(
                "GET",
                "/metrics",
                params=params,
                limit=METRICS_LIMIT,
                sink=reader.feed,
                allow_404=True,
            )
            if answer.status == 404:
                raise self._refused(
                    "/metrics", "it runs without --enable-metrics: start it with that flag"
                )
            try:
                snapshot = reader.result()
            except ValueError as error:
                raise self._unreadable("/metrics", str(error)) from error
            if snapshot is not None:
                return snapshot
        raise self._unreadable("/metrics", "no sglang:num_running_reqs in the payload")

    async def is_sleeping(self) -> bool:
        """Whether anything is released or paused, as its owner recorded it (SGLang itself does
        not say)."""
        return bool(self.outstanding)

    # --- sleep ----------------------------------------------------------------------------------

    # A `timeout` argument, as the vLLM client's: it counts from each request's turn.
    async def sleep(self, level: int, mode: str = "wait", *, timeout: float = 120.0) -> None:  # noqa: ASYNC109
        """Pause generation, check that the running batch is empty, release every tag.

        `level` must be what the server does: 1 with --enable-weights-cpu-backup, 2 without
        (whether a release keeps a host copy is the server's flag, not the call's). `mode` is
        the vLLM client's, ignored: SGLang's release never waits for or aborts requests; the
        caller drains first. A server that already sleeps is left as it is.
        """
        if level not in (1, 2):
            raise ValueError(f"an SGLang server sleeps at level 1 or 2, not {level!r}")
        budget = _Budget.of(timeout)
        facts = await self.facts()
        self._check_level(facts, level)
        if self.outstanding - {PAUSED}:
            return
        await self._set(self.outstanding | {PAUSED})
        try:
            # Before 0.5.6 the route reads no body (and aborts what runs: the caller drained).
            await self._post("/pause_generation", {"mode": facts.pause_mode}, budget)
        except EngineHTTPError as error:
            if 400 <= error.status < 500:  # refused (a key): nothing paused
                await self._set(self.outstanding - {PAUSED})
            raise
        snapshot = await self.activity()
        if snapshot.in_flight:
            # Held requests wait in the tokenizer, out of these counts: these reached the
            # scheduler before the pause. None may be there at a release.
            await self.continue_generation(budget)
            raise RequestsInFlightError(
                f"{self.base_url} still had {snapshot.running} request(s) running and "
                f"{snapshot.waiting} queued once paused: not released (a release with a "
                "request running kills an SGLang server); it serves on",
                url=self.base_url + "/release_memory_occupation",
            )
        tags = frozenset(facts.all_tags)
        await self._set(self.outstanding | tags)
        try:
            await self._post("/release_memory_occupation", {"tags": sorted(tags)}, budget)
        except EngineHTTPError as error:
            if 400 <= error.status < 500:
                # Refused before the scheduler saw it (a key, a bad body): nothing released.
                await self._set(self.outstanding - tags)
                await self.continue_generation(budget)
            raise

    def _check_level(self, facts: SGLangFacts, level: int) -> None:
        if not facts.memory_saver:
            raise self._refused(
                "/release_memory_occupation",
                "it runs without --enable-memory-saver, so a release frees nothing: start it "
                "with --enable-memory-saver",
            )
        if not facts.metrics:
            raise self._refused(
                "/metrics",
                "it runs without --enable-metrics, so Snooze cannot see requests in flight: "
                "start it with --enable-metrics",
            )
        if level == 1 and not facts.host_copy:
            raise self._refused(
                "/release_memory_occupation",
                "level 1 keeps a host copy of the weights, which needs "
                "--enable-weights-cpu-backup (SGLang 0.5.3+)",
            )

    # --- wake -----------------------------------------------------------------------------------

    async def wake(
        self,
        level: int,
        *,
        timeout: float = 300.0,  # noqa: ASYNC109
        staged: bool = False,
        done: Collection[str] = (),
        on_step: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        """Resume what was released and continue generation, within `timeout` seconds.

        Weights released without a host copy come back as memory, not weights: they are
        resumed alone, reloaded (/update_weights_from_disk) and the rest resumed after
        (`weights`, `reload_weights`, `kv_cache`, `continue`); with a host copy every tag is
        resumed at once (`all`, `continue`). Steps in `done` are skipped (a wake resumed after
        the caller restarted); `on_step` is awaited after each. `staged` is the vLLM client's.
        """
        budget = _Budget.of(timeout)
        facts = await self.facts()
        released = self.outstanding - {PAUSED}
        reload = level == 2 or not facts.host_copy
        steps: list[tuple[str, Callable[[], Awaitable[None]]]] = []
        if reload and WEIGHTS in released | ({WEIGHTS} if WEIGHTS in done else set()):
            rest = released - {WEIGHTS}
            steps.append((WEIGHTS, lambda: self._resume({WEIGHTS}, budget)))
            steps.append((RELOAD, lambda: self._reload(facts, budget)))
            if rest:
                steps.append((REST, lambda: self._resume(rest, budget)))
        elif released:
            steps.append((ALL, lambda: self._resume(released, budget)))
        steps.append((CONTINUE, lambda: self.continue_generation(budget)))
        for name, step in steps:
            if name in done and name != CONTINUE:
                continue
            await step()
            if on_step is not None:
                await on_step(name)

    async def _resume(self, wanted: Collection[str], budget: _Budget) -> None:
        tags = frozenset(wanted) & self.outstanding
        if not tags:
            return  # resumed before (the record lagged): a second resume kills the server
        await self._post("/resume_memory_occupation", {"tags": sorted(tags)}, budget)
        await self._set(self.outstanding - tags)

    async def _reload(self, facts: SGLangFacts, budget: _Budget) -> None:
        body: dict[str, Any] = {"model_path": facts.model_path}
        if facts.load_format:
            body["load_format"] = facts.load_format
        answer = await self._post("/update_weights_from_disk", body, budget)
        data = self._json(answer, "/update_weights_from_disk") if answer.body.strip() else {}
        if data.get("success") is False:
            message = error_message(answer.text)
            raise EngineHTTPError(
                f"{self.base_url} could not reload its weights from {facts.model_path!r}: "
                f"{message!r}. Its weights' memory is back but empty: restart the pod.",
                url=self.base_url + "/update_weights_from_disk",
                status=answer.status,
                message=message,
            )

    async def continue_generation(self, budget: _Budget | None = None) -> None:
        """Let generation run again (harmless on a server not paused)."""
        await self._post("/continue_generation", {}, budget or _Budget.of(self.timeout))
        await self._set(self.outstanding - {PAUSED})

    # --- the wire -------------------------------------------------------------------------------

    async def _set(self, outstanding: frozenset[str]) -> None:
        if outstanding == self.outstanding:
            return
        if self._record is not None:
            await self._record(outstanding)
        self.outstanding = outstanding

    async def _post(self, path: str, body: Any, budget: _Budget) -> Answer:
        remaining = budget.deadline - time.monotonic()
        if remaining <= 0:
            raise self._timed_out(path, budget.total)
        try:
            return await self._request("POST", path, json=body, budget=remaining)
        except EngineTimeoutError as error:
            raise self._timed_out(path, budget.total) from error

    async def _request(
        self,
        method: str,
        path: str,
        *,
        budget: float | None = None,
        params: Any = None,
        json: Any = None,
        limit: int = ANSWER_LIMIT,
        sink: Callable[[bytes], None] | None = None,
        allow_404: bool = False,
    ) -> Answer:
        answer = await self._send(
            method, path, budget=budget, params=params, json=json, limit=limit, sink=sink
        )
        if answer.is_success or (allow_404 and answer.status == 404):
            return answer
        if path == "/weights_checker" and b"Unsupported action" in answer.body:
            return Answer(status=404, body=answer.body)  # 0.5.6 to 0.5.11: no checksum action
        raise self._failed(answer, path)

    def _failed(self, answer: Answer, path: str) -> EngineHTTPError:
        message = error_message(answer.text)
        url = self.base_url + path
        if answer.status in (401, 403):
            return SleepModeDisabledError(
                f"{url} answered {answer.status} ({message!r}): the server wants a key "
                "(--api-key or --admin-api-key) that Snooze does not send. Start it without "
                "them and keep its port private (the chart's NetworkPolicy)",
                url=url,
                status=answer.status,
                message=message,
            )
        if answer.status == 404:
            return SleepModeDisabledError(
                f"{url} answered 404: this SGLang release has no {path} (Snooze needs 0.4.9 "
                "or later), or the port is not an SGLang server's",
                url=url,
                status=404,
                message=message,
            )
        hint = " Read the server's log; if it keeps failing, restart the pod."
        return EngineHTTPError(
            f"{url} answered {answer.status}: {message!r}.{hint if answer.status >= 500 else ''}",
            url=url,
            status=answer.status,
            message=message,
        )

    def _refused(self, path: str, why: str) -> SleepModeDisabledError:
        url = self.base_url + path
        return SleepModeDisabledError(
            f"{self.base_url} cannot sleep: {why}", url=url, status=200, message=why
        )

    def _unreadable(self, path: str, what: str, *, status: int = 200) -> EngineError:
        return InvalidAnswerError(
            f"{self.base_url}{path} answered something the client cannot read or believe "
            f"({what}). Is this port an SGLang server's, and spec.engine.kind right?",
            url=self.base_url + path,
            status=status,
            message=what,
        )

    def _timed_out(self, path: str, timeout: float) -> EngineError:
        return EngineTimeoutError(
            f"{self.base_url} took longer than {timeout:g}s answering {path}. It may still be "
            "working: the operator keeps what it sent as released, and a restart of the pod "
            "clears it.",
            url=self.base_url + path,
        )


async def weight_checksums(
    http: EngineHttp,
    base_url: str,
    *,
    timeout: float,  # noqa: ASYNC109
) -> dict[str, str] | None:
    """SGLang's digest of every weight tensor on every rank (/weights_checker `checksum`,
    0.5.12+), keyed `rankN:NAME`; None where the release has none (no route before 0.5.6, no
    such action before 0.5.12). Never another action: `snapshot` copies every weight to host
    RAM and `reset_tensors` overwrites them."""
    path = "/weights_checker"
    client = SGLangClient(base_url, client=http, timeout=min(timeout, 5.0))
    answer = await client._request(
        "POST", path, json={"action": "checksum"}, budget=timeout, allow_404=True
    )
    if answer.status == 404:
        return None
    data = client._json(answer, path)
    ranks = data.get("ranks")
    if not isinstance(ranks, list) or len(ranks) > MAX_RANKS:
        raise client._unreadable(path, "no ranks list")
    sums: dict[str, str] = {}
    for index, rank in enumerate(ranks):
        checksums = rank.get("checksums") if isinstance(rank, dict) else None
        if not isinstance(checksums, dict) or len(sums) + len(checksums) > MAX_TENSORS:
            raise client._unreadable(path, "a rank without a bounded checksums object")
        for name, value in checksums.items():
            if not isinstance(value, str) or len(value) > 128 or len(str(name)) > 1024:
                raise client._unreadable(path, "a checksum that is not a digest")
            sums[f"rank{index}:{name}"] = value
    return sums
