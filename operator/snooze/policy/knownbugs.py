"""vLLM and SGLang releases and engine configurations where sleep or wake is known to break,
the levels a vLLM release cannot wake from at all, and what an engine in one of them does
instead: pure, so that the tables and their reading are tested as data.

Each vLLM row comes from a vLLM issue and the commit or release that fixed it
(docs/vllm-contract.md says how each release bound was read in the released wheels). The image's
check command (images/vllm/plugin, `snooze-vllm-check --serve-args`) carries the same rows; a test
keeps the two equal. Each SGLang row was read in SGLang's released wheels (docs/sglang.md). The
level limits are no bug of vLLM's but a route a release does not have yet.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

Release = tuple[int, int, int]
OnKnownBug = Literal["FallBack", "NeverSleep", "SleepAnyway"]
VLLM, SGLANG = "vllm", "sglang"
LEVELS = (1, 2)

# Leading release numbers only: a local tag (+cu129) or a suffix (rc1, .dev12) does not move a
# build out of its release line.
_RELEASE = re.compile(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?")


def release_of(version: str | None) -> Release | None:
    """The (major, minor, patch) of a vLLM version string, None if it has none; pure."""
    match = _RELEASE.match(version or "")
    if match is None:
        return None
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def format_release(release: Release) -> str:
    return ".".join(str(part) for part in release)


@dataclass(frozen=True, kw_only=True)
class KnownBug:
    """One row: where it breaks (every condition given must hold), what happens, and where
    that is written."""

    key: str
    """A short name, stable across releases of Snooze (metrics, Events, the image's check)."""
    first: Release | None
    """The first affected release; None: every release that has the feature."""
    fixed: Release | None
    """The first release that carries the fix; None: no release is known to."""
    levels: frozenset[int]
    """The sleep levels it breaks."""
    lora: bool = False
    """Only with LoRA adapters (--enable-lora)."""
    tensor_parallel: bool = False
    """Only at --tensor-parallel-size above 1."""
    any_parallel: bool = False
    """Only at --tensor-parallel-size or --pipeline-parallel-size above 1."""
    in_flight: bool = False
    """Only when /sleep reaches the engine with requests still in flight: sleeping a drained
    engine avoids it, and no other level does."""
    what: str
    """What happens, in a line."""
    source: str
    """The vLLM issue and the pull request that fixed it (for SGLang, where it was read)."""
    engine: str = VLLM
    """The engine kind whose releases the row counts."""

    def applies(self, facts: ServeFacts) -> bool:
        """Whether the engine's release and configuration are in this row (at some level).
        An engine whose release is unknown is taken to be in it: an unknown is not safe."""
        if self.engine != facts.engine:
            return False
        if self.lora and not facts.lora:
            return False
        if self.tensor_parallel and facts.tensor_parallel <= 1:
            return False
        if self.any_parallel and facts.tensor_parallel <= 1 and facts.pipeline_parallel <= 1:
            return False
        release = facts.release
        if release is None:
            return True
        if self.first is not None and release < self.first:
            return False
        return self.fixed is None or release < self.fixed

    @property
    def releases(self) -> str:
        """The affected releases, as the docs print them."""
        low = "every release" if self.first is None else format_release(self.first)
        if self.fixed is None:
            return f"{low} and later (no release known to carry the fix)"
        if self.first is None:
            return f"before {format_release(self.fixed)}"
        return f"{low} to before {format_release(self.fixed)}"


TABLE: tuple[KnownBug, ...] = (
    KnownBug(
        key="lora-tp-level1",
        first=None,
        fixed=None,
        levels=frozenset({1}),
        lora=True,
        tensor_parallel=True,
        what="a level-1 wake leaves the LoRA state corrupted: the adapter stops applying and "
        "answers differ from those before the sleep, with no error",
        source="vllm#53888 (reported on 0.27.1; closed as fixed by PR #53508, which no "
        "released wheel was shown to carry)",
    ),
    KnownBug(
        key="lora-level2",
        first=(0, 10, 2),
        fixed=(0, 28, 0),
        levels=frozenset({2}),
        lora=True,
        what="the weight reload after a level-2 sleep fails (KeyError on a base_layer name) or "
        "leaves the LoRA tensors undefined, which corrupts answers",
        source="vllm#39934, fixed by PR #39935 (reset_lora_state, first in 0.28.0)",
    ),
    KnownBug(
        key="in-flight-sleep-parallel",
        first=None,
        fixed=(0, 25, 0),
        levels=frozenset(LEVELS),
        any_parallel=True,
        in_flight=True,
        what="/sleep with requests in flight unmaps memory under running kernels and NCCL "
        "collectives: CUDA illegal address, the engine dies (the /sleep itself answers 200)",
        source="vllm#45520 (the worker synchronizes the device before unmapping from 0.25.0)",
    ),
)


SGLANG_TABLE: tuple[KnownBug, ...] = (
    KnownBug(
        key="sglang-abort-pause-then-assert",
        first=(0, 5, 5),
        fixed=(0, 5, 6),
        levels=frozenset(LEVELS),
        in_flight=True,
        what="/pause_generation only aborts requests (it pauses no scheduler before 0.5.6) while "
        "the release asserts an idle scheduler: a request still in the batch kills the server",
        source="SGLang 0.5.5: scheduler_update_weights_mixin.py release_memory_occupation "
        "asserts _is_no_request; pause modes arrive in 0.5.6 (io_struct.py)",
        engine=SGLANG,
    ),
    KnownBug(
        key="sglang-tp-release-answers-early",
        first=None,
        fixed=None,
        levels=frozenset(),
        tensor_parallel=True,
        what="the release answers once tensor-parallel rank 0 has freed its memory; no barrier "
        "waits for the other ranks, whose memory may still be held (a GPU pool's neighbour "
        "waking at once can run out of memory)",
        source="SGLang 0.5.23: weight_updater.py release_memory_occupation (a barrier before "
        "the weights' pause only) and the scheduler's reply from rank 0",
        engine=SGLANG,
    ),
)
"""SGLang's rows (docs/sglang.md). A server without --enable-memory-saver, --enable-metrics or
/pause_generation is not a row: it is never put to sleep at all (sglang_refusal)."""
OLDEST_SGLANG: Release = (0, 4, 9)
"""The first SGLang release with /pause_generation: before, a request sent while the memory is
released runs on it and kills the server."""


def table_for(engine: str) -> tuple[KnownBug, ...]:
    """The rows of an engine kind."""
    return SGLANG_TABLE if engine == SGLANG else TABLE


@dataclass(frozen=True, kw_only=True)
class LevelLimit:
    """A sleep level whose wake a release cannot carry out rightly, in any configuration: no
    setting sleeps an engine there (wake.onKnownBug: SleepAnyway neither)."""

    level: int
    since: Release
    """The first release that can."""
    what: str
    """What a wake from that level does on the releases before."""
    source: str
    """Where that was read."""

    def applies(self, release: Release | None) -> bool:
        """An engine whose release is unknown is taken to be before it: an unknown is not safe."""
        return release is None or release < self.since

    @property
    def said(self) -> str:
        return f"sleep level {self.level} needs vLLM {format_release(self.since)} or later"


LIMITS: tuple[LevelLimit, ...] = (
    LevelLimit(
        level=2,
        since=(0, 10, 2),
        what="a level-2 wake must reload the discarded weights (POST /collective_rpc "
        "reload_weights), a route vLLM serves from 0.10.2; before, the reload answers 404: on "
        "0.8.3 to 0.10.1 the engine stays asleep and every wake fails until it restarts, and "
        "on 0.8.0 to 0.8.2, whose /wake_up reads no tags and wakes everything, it wakes and "
        "serves from the discarded weights",
        source="vllm/entrypoints/openai/api_server.py of each release: /collective_rpc first "
        "in 0.10.2, /wake_up reads its tags from 0.8.3",
    ),
)


def level_limits(facts: ServeFacts, limits: Sequence[LevelLimit] = LIMITS) -> list[LevelLimit]:
    """The levels the engine's release cannot wake from (vLLM's: an SGLang release's version
    is no vLLM release, and its levels are its flags')."""
    if facts.engine != VLLM:
        return []
    return [limit for limit in limits if limit.applies(facts.release)]


@dataclass(frozen=True, kw_only=True)
class ServeFacts:
    """What decides whether an engine is in the table: its release (from its /version, or
    SGLang's /server_info) and how it was started (its pod's `vllm serve` arguments, or what
    SGLang's /server_info says of them)."""

    version: str | None = None
    """The engine's release; None: not known yet."""
    lora: bool = False
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    engine: str = VLLM
    """The engine kind (spec.engine.kind)."""
    host_copy: bool | None = None
    """SGLang: whether its releases keep a host copy of the weights
    (--enable-weights-cpu-backup); None: not known yet."""

    @property
    def release(self) -> Release | None:
        return release_of(self.version)

    @property
    def parallel(self) -> bool:
        return self.lora or self.tensor_parallel > 1 or self.pipeline_parallel > 1


def known_bugs(facts: ServeFacts, table: Sequence[KnownBug] | None = None) -> list[KnownBug]:
    """Every row the engine is in, at any level (of its kind's table unless one is given)."""
    rows = table_for(facts.engine) if table is None else table
    return [bug for bug in rows if bug.applies(facts)]


def sglang_level(host_copy: bool | None) -> int | None:
    """The level an SGLang server sleeps at: whether a release keeps a host copy of the
    weights is its own flag (--enable-weights-cpu-backup), not the call's, so level 1 is a
    server with the flag and level 2 one without, whatever the spec asks; None while its
    flags are not known (it is not put to sleep before they are)."""
    if host_copy is None:
        return None
    return 1 if host_copy else 2


@dataclass(frozen=True, kw_only=True)
class Conduct:
    """How an engine sleeps given the rows it is in."""

    level: int | None
    """The level to sleep at; None: it does not sleep."""
    drained_only: bool = False
    """/sleep only once no request is in flight: a drain that times out is given up."""
    bugs: tuple[KnownBug, ...] = ()
    """The rows the engine is in."""
    refused: tuple[LevelLimit, ...] = ()
    """The level it wanted, which its release cannot wake from."""
    why: str = ""
    """What Snooze does about them, for the KnownBug condition; empty when in none."""


def conduct(
    facts: ServeFacts,
    level: int,
    on_known_bug: OnKnownBug,
    table: Sequence[KnownBug] | None = None,
    limits: Sequence[LevelLimit] = LIMITS,
) -> Conduct:
    """Pure: the level an engine sleeps at, when it wants `level`, and whether it must be
    drained first; `on_known_bug` is the spec's wake.onKnownBug. A level the vLLM release
    cannot wake from is refused whatever it says: the engine sleeps at level 1 instead, unless
    a row rules that out too. An SGLang server sleeps at the level its flags make
    (sglang_level), and is always drained first: a release with a request in its running
    batch kills it."""
    bugs = tuple(known_bugs(facts, table))
    if facts.engine == SGLANG:
        server_level = sglang_level(facts.host_copy)
        if server_level is None:
            return Conduct(level=None, drained_only=True, bugs=bugs)
        return replace(_conduct(bugs, server_level, on_known_bug, frozenset()), drained_only=True)
    limited = level_limits(facts, limits)
    blocked = frozenset(limit.level for limit in limited)
    refused = tuple(limit for limit in limited if limit.level == level)
    if not refused:
        return _conduct(bugs, level, on_known_bug, blocked)
    fallback = next(lvl for lvl in LEVELS if lvl not in blocked)
    inner = _conduct(bugs, fallback, on_known_bug, blocked)
    instead = inner.why or (
        f"sleeps at level {inner.level} instead of {level}"
        if inner.level is not None
        else "stays awake"
    )
    return replace(inner, refused=refused, why=f"{refused[0].said}: {instead}")


def _conduct(
    bugs: tuple[KnownBug, ...], level: int, on_known_bug: OnKnownBug, blocked: frozenset[int]
) -> Conduct:
    if not bugs:
        return Conduct(level=level)
    breaks = {lvl for bug in bugs if not bug.in_flight for lvl in bug.levels} | blocked
    racy = any(bug.in_flight for bug in bugs)
    if on_known_bug == "SleepAnyway":
        return Conduct(
            level=level, bugs=bugs, why=f"sleeps at level {level} anyway (wake.onKnownBug)"
        )
    if on_known_bug == "NeverSleep":
        if level in breaks or racy:
            return Conduct(level=None, bugs=bugs, why="stays awake (wake.onKnownBug: NeverSleep)")
        return Conduct(level=level, bugs=bugs, why=f"sleeps at level {level}, which is safe")
    drained = " once drained (a drain that times out is given up)" if racy else ""
    if level not in breaks:
        return Conduct(
            level=level, drained_only=racy, bugs=bugs, why=f"sleeps at level {level}{drained}"
        )
    other = [lvl for lvl in LEVELS if lvl != level and lvl not in breaks]
    if other:
        return Conduct(
            level=other[0],
            drained_only=racy,
            bugs=bugs,
            why=f"sleeps at level {other[0]} instead of {level}{drained}",
        )
    return Conduct(level=None, bugs=bugs, why="stays awake: no sleep level is safe")


def sglang_refusal(*, version: str | None, memory_saver: bool, metrics: bool) -> str | None:
    """Pure: why an SGLang server is never put to sleep, naming what to change; None when it
    can be."""
    release = release_of(version)
    if release is not None and release < OLDEST_SGLANG:
        return (
            f"SGLang {version} has no /pause_generation (0.4.9+): a request sent while its "
            "memory is released would run on it and kill the server. Upgrade SGLang"
        )
    if not memory_saver:
        return (
            "the server runs without --enable-memory-saver: its release answers 200 and frees "
            "nothing. Start it with --enable-memory-saver (and --enable-weights-cpu-backup for "
            "level 1)"
        )
    if not metrics:
        return (
            "the server runs without --enable-metrics: Snooze cannot see requests in flight, "
            "and a release with one running kills the server. Start it with --enable-metrics"
        )
    return None


def describe(bugs: Sequence[KnownBug], refused: Sequence[LevelLimit] = ()) -> str:
    """The rows and the refused levels, for a condition or an Event: what happens and where it
    is written."""
    rows = [f"{bug.key}: {bug.what} ({bug.source})" for bug in bugs]
    rows += [f"level {limit.level}: {limit.what} ({limit.source})" for limit in refused]
    return "; ".join(rows)
