"""What an engine's `/metrics` says about its work and its sleep, read from the few lines a probe
asks for (`name[]`): requests running and waiting, requests finished, the sleep state, the
sleeps under way, and the engine's share of its GPU."""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass

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
_WANTED = frozenset(ACTIVITY_METRICS)


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


def label(labels: str, key: str) -> str | None:
    """The value of one label in the text between a sample's braces (escapes kept as sent)."""
    match = re.search(rf'(?:^|,)\s*{re.escape(key)}="((?:[^"\\]|\\.)*)"', labels)
    return None if match is None else match.group(1)


def samples(text: str, wanted: frozenset[str] = _WANTED) -> list[tuple[str, str, float]]:
    """The (name, label text, value) of each sample named in `wanted` (by default the probe's)
    in a Prometheus text payload; raises ValueError on a malformed line.

    A probe reads a few lines every few seconds from thousands of engines: this reads only
    what it needs, about ten times faster than prometheus_client's general parser.
    """
    found = []
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        space = line.find(" ")
        if brace != -1 and (space == -1 or brace < space):
            name, close = line[:brace], line.rfind("}")
            if close < brace:
                raise ValueError(f"unclosed labels: {line[:80]!r}")
            labels, rest = line[brace + 1 : close], line[close + 1 :]
        else:
            if space == -1:
                raise ValueError(f"no value: {line[:80]!r}")
            name, labels, rest = line[:space], "", line[space:]
        if name not in wanted:
            continue
        words = rest.split()
        if not words:
            raise ValueError(f"no value: {line[:80]!r}")
        found.append((name, labels, float(words[0])))
    return found


def parse_activity(text: str) -> ActivitySnapshot | None:
    """Return the activity in a Prometheus text payload, or None if it has no request gauges.

    Pure; raises ValueError for a payload that is not Prometheus text. Samples are summed over
    label sets because a data-parallel engine publishes one per `engine` label. When those
    disagree on the sleep state, the deepest one wins: an engine partly asleep cannot serve.
    """
    running = waiting = success = 0.0
    seen_gauge = False
    state: SleepState | None = None
    share: float | None = None
    sleeps: float | None = None
    for name, labels, value in samples(text):
        if name == RUNNING:
            running += value
            seen_gauge = True
        elif name == WAITING:
            waiting += value
            seen_gauge = True
        elif name == SUCCESS:
            success += value
        elif name == OPERATIONS and label(labels, "operation") == "sleep":
            sleeps = (sleeps or 0.0) + value
        elif name == CACHE_CONFIG:
            share = _share(label(labels, "gpu_memory_utilization")) or share
        elif name == SLEEP_STATE and value == 1:
            try:
                candidate = SleepState(label(labels, "sleep_state") or "")
            except ValueError:
                continue  # a state a later vLLM may add; ignore rather than fail the probe
            if state is None or _DEPTH[candidate] > _DEPTH[state]:
                state = candidate
    if not seen_gauge:
        return None
    return ActivitySnapshot(
        running=round(running),
        waiting=round(waiting),
        success_total=success,
        sleep_state=state,
        gpu_memory_utilization=share,
        sleeps_in_flight=None if sleeps is None else round(sleeps),
    )


def _share(text: str | None) -> float | None:
    try:
        value = float(text) if text is not None else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) and 0 < value <= 1 else None
