"""What an SGLang server says of itself: its arguments and release (`/server_info`), and its work
(`/metrics`, with --enable-metrics), each value checked, since a pod serves what it likes.

Read in SGLang's wheels (docs/sglang.md): the names are those of 0.4.9 to 0.5.23.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from snooze.engine.activity import ActivityNames, ActivityReader, ActivitySnapshot

RUNNING = "sglang:num_running_reqs"
QUEUED = "sglang:num_queue_reqs"
# A counter of finished requests (the tokenizer's, label is_streaming): asked for by its sample
# name, as prometheus_client's `name[]` filter matches sample names.
REQUESTS = "sglang:num_requests_total"
PROBE_METRICS = (RUNNING, QUEUED, REQUESTS)
WEIGHTS, KV_CACHE, CUDA_GRAPH = "weights", "kv_cache", "cuda_graph"
PAUSED = "paused"
"""A mark beside the released tags: generation is paused and not yet continued."""
_RELEASE = re.compile(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?")
_PATH_LIMIT = 4096


def release_of(version: str) -> tuple[int, int, int] | None:
    match = _RELEASE.match(version)
    if match is None:
        return None
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


@dataclass(frozen=True)
class SGLangFacts:
    """What Snooze reads of an SGLang server's `/server_info` (never its keys, which SGLang
    prints there in clear)."""

    version: str
    memory_saver: bool
    """--enable-memory-saver: without it a release frees nothing."""
    host_copy: bool
    """--enable-weights-cpu-backup (0.5.3+): a release keeps the weights in host RAM."""
    metrics: bool
    """--enable-metrics: without it /metrics is 404."""
    model_path: str
    """What /update_weights_from_disk reloads after a release without a host copy."""
    load_format: str | None = None
    tensor_parallel: int = 1
    """--tp-size: its ranks, each releasing its own memory."""

    @property
    def release(self) -> tuple[int, int, int]:
        return release_of(self.version) or (0, 0, 0)

    @property
    def all_tags(self) -> tuple[str, ...]:
        """What a release frees: weights and KV cache, and from 0.5.5 the CUDA graphs too
        (constants.py GPU_MEMORY_ALL_TYPES)."""
        if self.release >= (0, 5, 5):
            return (KV_CACHE, WEIGHTS, CUDA_GRAPH)
        return (WEIGHTS, KV_CACHE)

    @property
    def pause_mode(self) -> str:
        """`retract` where a paused scheduler may hold retracted requests through a release
        (0.5.21+), `in_place` where it may not (0.5.6 to 0.5.20); before 0.5.6
        /pause_generation reads no body and aborts every request. Snooze releases only once
        the paused scheduler holds no request at all, whichever the mode."""
        if self.release >= (0, 5, 21):
            return "retract"
        return "in_place" if self.release >= (0, 5, 6) else "abort"

    @property
    def checksums(self) -> bool:
        """/weights_checker's `checksum` action, 0.5.12+."""
        return self.release >= (0, 5, 12)


def parse_server_info(data: Any) -> SGLangFacts:
    """The facts in a `/server_info` (or `/get_server_info`) answer; ValueError naming what is
    missing or not believable."""
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    version = data.get("version")
    if not isinstance(version, str) or not version or len(version) > 64:
        raise ValueError("no version string")
    if release_of(version) is None:
        raise ValueError(f"version {version[:64]!r} is not a release")
    flags: dict[str, bool] = {}
    for key in ("enable_memory_saver", "enable_metrics", "enable_weights_cpu_backup"):
        value = data.get(key, False)
        if not isinstance(value, bool):
            raise ValueError(f"{key} is not true or false")
        flags[key] = value
    model_path = data.get("model_path")
    if not isinstance(model_path, str) or not model_path or len(model_path) > _PATH_LIMIT:
        raise ValueError("no model_path")
    tensor = data.get("tp_size", 1)
    if not isinstance(tensor, int) or isinstance(tensor, bool) or not 1 <= tensor <= 1024:
        raise ValueError("tp_size is not a parallel size")
    load_format = data.get("load_format")
    if load_format is not None and (not isinstance(load_format, str) or len(load_format) > 64):
        raise ValueError("load_format is not a short string")
    return SGLangFacts(
        version=version,
        memory_saver=flags["enable_memory_saver"],
        host_copy=flags["enable_weights_cpu_backup"],
        metrics=flags["enable_metrics"],
        model_path=model_path,
        load_format=load_format,
        tensor_parallel=tensor,
    )


class SGLangActivityReader(ActivityReader):
    """Reads an SGLang server's `/metrics` as ActivityReader reads vLLM's, by SGLang's names;
    its sleep state stays unknown (SGLang publishes none)."""

    names = ActivityNames(RUNNING, QUEUED, REQUESTS, PROBE_METRICS)


def parse_sglang_activity(text: str) -> ActivitySnapshot | None:
    """Pure: the activity in a whole SGLang metrics page (None without its request gauges)."""
    reader = SGLangActivityReader()
    reader.feed(text.encode())
    return reader.result()
