"""What an engine's `/metrics` says about its work and its sleep, read from the few lines a probe
asks for (`name[]`): requests running and waiting, requests finished, the sleep state, the
sleeps under way, and the engine's share of its GPU; every value checked, since an engine's
page is whatever its pod chooses to serve."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from snooze.engine.exposition import COUNTER_LIMIT, Labels, Page, checked_count, shown

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
# prometheus_client's `name[]` filter matches sample names, not family names: a counter is
# found by `vllm:request_success_total`, while `vllm:request_success` returns nothing.
SUCCESS = "vllm:request_success_total"
SLEEP_STATE = "vllm:engine_sleep_state"
# vLLM 0.32+: sleeps and wakes the API server is carrying out now (label `operation`).
OPERATIONS = "vllm:sleep_mode_operations_in_flight"
# A gauge fixed at 1 whose labels are the engine's CacheConfig: `gpu_memory_utilization` is
# the share of the device the engine takes awake (what a GPU pool needs to know). Static:
# asked for until the engine has said it once (its 37 labels cost more to read than the rest).
CACHE_CONFIG = "vllm:cache_config_info"
PROBE_METRICS = (RUNNING, WAITING, SUCCESS, SLEEP_STATE, OPERATIONS)
ACTIVITY_METRICS = (*PROBE_METRICS, CACHE_CONFIG)
# The most a probe reads of a `/metrics` answer (the page is then refused: AnswerTooLarge).
# The filtered page is a few lines (under 1 kB); a whole page, read only when the filter finds
# nothing (vLLM with several API servers), was 41 kB for a simulated 0.33 engine with its
# histograms filled (benchmarks/README.md, scrape cost): 8 MiB leaves a real one two hundred
# times that, and costs the operator about 40 ms of CPU to read.
METRICS_LIMIT = 8 << 20
# Series of the families a probe reads: one of each per engine of a data-parallel engine
# (vllm:engine_sleep_state three), so a few hundred at most.
SERIES_LIMIT = 4096
# No engine holds a million requests (vLLM runs at most max_num_seqs, 256 by default, and
# queues the rest).
REQUESTS_LIMIT = 1_000_000


class SleepState(enum.StrEnum):
    """The values of the `sleep_state` label of `vllm:engine_sleep_state` (vLLM 0.11.1+)."""

    AWAKE = "awake"
    WEIGHTS_OFFLOADED = "weights_offloaded"  # level 1
    DISCARD_ALL = "discard_all"  # level 2


_DEPTH = {SleepState.AWAKE: 0, SleepState.WEIGHTS_OFFLOADED: 1, SleepState.DISCARD_ALL: 2}


@dataclass(frozen=True)
class ActivitySnapshot:
    """What one scrape of an engine's `/metrics` says about its work."""

    running: int
    """Requests being processed (`vllm:num_requests_running`, summed over engines)."""
    waiting: int
    """Requests queued (`vllm:num_requests_waiting`, summed over engines)."""
    success_total: float
    """Requests finished so far, every `finished_reason` summed; idle while it stays put."""
    sleep_state: SleepState | None
    """The engine's sleep state, or None when the engine does not publish it (before 0.11.1)."""
    gpu_memory_utilization: float | None = None
    """The engine's share of its device's memory (its --gpu-memory-utilization), if published."""
    sleeps_in_flight: int | None = None
    """Sleeps the engine is carrying out now (vLLM 0.32+); None when it does not say."""

    @property
    def in_flight(self) -> int:
        """Requests the engine holds now: running plus waiting."""
        return self.running + self.waiting

    @property
    def sleep_level(self) -> int | None:
        """The level it sleeps at (1 weights offloaded, 2 discarded), 0 awake, None unknown."""
        return None if self.sleep_state is None else _DEPTH[self.sleep_state]


@dataclass(frozen=True)
class ActivityNames:
    """Where an engine's page says its work: the gauges of requests running and waiting, the
    counter of requests finished, and every family a reader asks for."""

    running: str
    waiting: str
    success: str
    wanted: tuple[str, ...]


VLLM_NAMES = ActivityNames(RUNNING, WAITING, SUCCESS, ACTIVITY_METRICS)


class ActivityReader:
    """Reads an engine's `/metrics` answer a chunk at a time (`feed`) into an ActivitySnapshot
    (`result`), with every value checked: the page is untrusted, and a value no engine can
    have (NaN, an infinity, a negative or impossibly large count, a series sent twice) makes it
    unreadable, a ValueError that says which value, rather than a count the policy would act
    on. Memory stays bounded whatever the page's size (exposition.Page); the caller bounds its
    bytes and its time.
    """

    names = VLLM_NAMES

    def __init__(self) -> None:
        self._page = Page(self.names.wanted, self._sample, series_limit=SERIES_LIMIT)
        self._running = self._waiting = self._success = 0.0
        self._seen_gauge = False
        self._state: SleepState | None = None
        self._share: float | None = None
        self._sleeps: float | None = None

    def feed(self, chunk: bytes) -> None:
        self._page.feed(chunk)

    def result(self) -> ActivitySnapshot | None:
        """The activity on the page, or None if it has no request gauges."""
        self._page.close()
        if not self._seen_gauge:
            return None
        names = self.names
        running = checked_count(names.running, self._running, REQUESTS_LIMIT, summed=True)
        waiting = checked_count(names.waiting, self._waiting, REQUESTS_LIMIT, summed=True)
        success = checked_count(names.success, self._success, COUNTER_LIMIT, summed=True)
        return ActivitySnapshot(
            running=round(running),
            waiting=round(waiting),
            success_total=success,
            sleep_state=self._state,
            gpu_memory_utilization=self._share,
            sleeps_in_flight=None if self._sleeps is None else round(self._sleeps),
        )

    def _sample(self, name: str, labels: Labels, value: float) -> None:
        # Summed over label sets: a data-parallel engine publishes one per `engine` label.
        if name == self.names.running:
            self._running += checked_count(name, value, REQUESTS_LIMIT)
            self._seen_gauge = True
        elif name == self.names.waiting:
            self._waiting += checked_count(name, value, REQUESTS_LIMIT)
            self._seen_gauge = True
        elif name == self.names.success:
            self._success += checked_count(name, value, COUNTER_LIMIT)
        elif name == OPERATIONS:
            value = checked_count(name, value, REQUESTS_LIMIT)
            if labels.get("operation") == "sleep":
                self._sleeps = (self._sleeps or 0.0) + value
        elif name == CACHE_CONFIG:
            self._share = _share(labels.get("gpu_memory_utilization")) or self._share
        elif name == SLEEP_STATE:
            if value not in (0.0, 1.0):
                raise ValueError(f"{SLEEP_STATE} is {shown(value)}, where a state is 1 or 0")
            if value == 1:
                self._note_state(labels.get("sleep_state") or "")

    def _note_state(self, text: str) -> None:
        # When the engines of a data-parallel engine disagree, the deepest state wins: an
        # engine partly asleep cannot serve.
        try:
            candidate = SleepState(text)
        except ValueError:
            return  # a state a later vLLM may add; ignore rather than fail the probe
        if self._state is None or _DEPTH[candidate] > _DEPTH[self._state]:
            self._state = candidate


def parse_activity(text: str) -> ActivitySnapshot | None:
    """Pure: the activity in a whole Prometheus text payload, or None if it has no request
    gauges; ValueError for a payload that is not Prometheus text or holds a value that no
    engine can have (ActivityReader)."""
    reader = ActivityReader()
    reader.feed(text.encode())
    return reader.result()


def _share(text: str | None) -> float | None:
    try:
        value = float(text) if text is not None else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) and 0 < value <= 1 else None
