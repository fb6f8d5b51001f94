"""vLLM releases and `vllm serve` arguments where sleep or wake is known to break: the rows of
Snooze's own table (its operator reads the same, from the pod's arguments and the engine's
/version; a test of Snooze's keeps the two equal), for the image's check command."""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Sequence

from snooze_vllm_patch.versions import release_of

Release = tuple[int, int, int]


@dataclasses.dataclass(frozen=True)
class Row:
    """Where sleep or wake breaks: every condition given must hold."""

    key: str
    first: Release | None
    """The first affected release; None: every release that has the feature."""
    fixed: Release | None
    """The first release with the fix; None: no release is known to carry it."""
    levels: frozenset[int]
    lora: bool = False
    tensor_parallel: bool = False
    """Only at tensor parallel above 1."""
    any_parallel: bool = False
    """Only at tensor or pipeline parallel above 1."""
    in_flight: bool = False
    """Only when /sleep meets requests in flight: a drained sleep avoids it."""
    what: str = ""
    source: str = ""


ROWS: tuple[Row, ...] = (
    Row(
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
    Row(
        key="lora-level2",
        first=(0, 10, 2),
        fixed=(0, 28, 0),
        levels=frozenset({2}),
        lora=True,
        what="the weight reload after a level-2 sleep fails (KeyError on a base_layer name) or "
        "leaves the LoRA tensors undefined, which corrupts answers",
        source="vllm#39934, fixed by PR #39935 (reset_lora_state, first in 0.28.0)",
    ),
    Row(
        key="in-flight-sleep-parallel",
        first=None,
        fixed=(0, 25, 0),
        levels=frozenset({1, 2}),
        any_parallel=True,
        in_flight=True,
        what="/sleep with requests in flight unmaps memory under running kernels and NCCL "
        "collectives: CUDA illegal address, the engine dies (the /sleep itself answers 200)",
        source="vllm#45520 (the worker synchronizes the device before unmapping from 0.25.0)",
    ),
)


@dataclasses.dataclass(frozen=True)
class ServeArgs:
    """What the rows read in `vllm serve`'s arguments."""

    lora: bool = False
    tensor_parallel: int = 1
    pipeline_parallel: int = 1


def parse_serve_args(text: str) -> ServeArgs:
    """Read a `vllm serve` command line as vLLM's parser would (`--x_y` is `--x-y`; `-tp` and
    `-pp` the short forms); what is not given keeps vLLM's default."""
    words = shlex.split(text)
    lora, tensor, pipeline = False, 1, 1
    for i, raw in enumerate(words):
        flag, _, inline = raw.partition("=")
        if flag.startswith("--"):
            flag = "--" + flag[2:].replace("_", "-")
        value = inline or (words[i + 1] if i + 1 < len(words) else "")
        if flag == "--lora-modules" or (
            flag == "--enable-lora" and inline.lower() not in ("false", "0")
        ):
            lora = True
        elif flag == "--no-enable-lora":
            lora = False
        elif flag in ("--tensor-parallel-size", "-tp") and value.isdigit():
            tensor = int(value)
        elif flag in ("--pipeline-parallel-size", "-pp") and value.isdigit():
            pipeline = int(value)
    return ServeArgs(lora=lora, tensor_parallel=tensor, pipeline_parallel=pipeline)


def rows_for(version: str, args: ServeArgs, rows: Sequence[Row] = ROWS) -> list[Row]:
    """The rows this release and these arguments are in (all that fit the arguments when the
    release cannot be read: an unknown release is not safe)."""
    release = release_of(version)
    found = []
    for row in rows:
        if row.lora and not args.lora:
            continue
        if row.tensor_parallel and args.tensor_parallel <= 1:
            continue
        if row.any_parallel and args.tensor_parallel <= 1 and args.pipeline_parallel <= 1:
            continue
        if release is not None and (
            (row.first is not None and release < row.first)
            or (row.fixed is not None and release >= row.fixed)
        ):
            continue
        found.append(row)
    return found
