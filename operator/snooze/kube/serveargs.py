"""What a pod's `vllm serve` arguments say about how its engine runs: LoRA adapters and the
tensor and pipeline parallel sizes, which decide whether a known vLLM bug applies to it, and
whether sleep mode is on."""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# vLLM's parser (FlexibleArgumentParser) reads `--tensor_parallel_size` as
# `--tensor-parallel-size`; its short forms are `-tp` and `-pp`.
LORA_FLAGS = ("--enable-lora", "--lora-modules")
TENSOR_PARALLEL = ("--tensor-parallel-size", "-tp")
PIPELINE_PARALLEL = ("--pipeline-parallel-size", "-pp")
SLEEP_MODE = "--enable-sleep-mode"
CONFIG = "--config"
LARGEST = 1024
"""A parallel size above this is not a real engine's: read as not given."""


@dataclass(frozen=True)
class ServeArgs:
    """The arguments of the pod's containers that the known-bug table reads."""

    lora: bool = False
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    sleep_mode: bool | None = None
    """--enable-sleep-mode given (True) or turned off (False); None: neither, which is vLLM's
    default (off) unless a --config file sets it."""
    config_file: bool = False
    """A --config file gives more arguments, which are not read here."""


def serve_args(spec: Mapping[str, Any]) -> ServeArgs:
    """Read the containers' command and args (a shell command line given as one word, as in
    `sh -c "vllm serve ..."`, is split as the shell would). What is not given keeps vLLM's
    default; a value that is not a number is ignored."""
    words = list(_words(spec))
    lora = False
    tensor = pipeline = None
    sleep_mode: bool | None = None
    config_file = False
    for i, raw in enumerate(words):
        flag, _, inline = raw.partition("=")
        if flag.startswith("--"):
            flag = "--" + flag[2:].replace("_", "-")
        value = inline if inline else (words[i + 1] if i + 1 < len(words) else "")
        if flag in LORA_FLAGS:
            lora = lora or flag == "--lora-modules" or inline.lower() not in ("false", "0")
        elif flag == "--no-enable-lora":
            lora = False
        elif flag in TENSOR_PARALLEL:
            tensor = _size(value) or tensor
        elif flag in PIPELINE_PARALLEL:
            pipeline = _size(value) or pipeline
        elif flag == SLEEP_MODE:
            sleep_mode = inline.lower() not in ("false", "0")
        elif flag == "--no-enable-sleep-mode":
            sleep_mode = False
        elif flag == CONFIG:
            config_file = True
    return ServeArgs(
        lora=lora,
        tensor_parallel=tensor or 1,
        pipeline_parallel=pipeline or 1,
        sleep_mode=sleep_mode,
        config_file=config_file,
    )


def _words(spec: Mapping[str, Any]) -> Iterable[str]:
    for container in spec.get("containers") or []:
        if not isinstance(container, Mapping):
            continue
        for word in [*(container.get("command") or []), *(container.get("args") or [])]:
            text = str(word)
            if any(c.isspace() for c in text):
                try:
                    yield from shlex.split(text)
                except ValueError:
                    yield from text.split()
            else:
                yield text


def _size(text: str) -> int | None:
    try:
        size = int(text)
    except ValueError:
        return None
    return size if 1 <= size <= LARGEST else None
