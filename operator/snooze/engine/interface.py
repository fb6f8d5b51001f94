"""The engine interface the operator puts engines to sleep and wakes them through, and its two
implementations chosen by the model's engine kind: vLLM's (engine/client.py) and SGLang's
(engine/sglang.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection
from typing import Protocol

from snooze.engine.activity import ActivitySnapshot
from snooze.engine.client import EngineClient
from snooze.engine.http import EngineHttp
from snooze.engine.sglang import Record, SGLangClient

KINDS = ("vllm", "sglang")


class SleepingEngine(Protocol):
    """What the operator asks of one engine: its activity, to sleep at a level, to wake from
    one, and whether it sleeps. Every method raises only EngineError subclasses."""

    @property
    def base_url(self) -> str: ...

    async def activity(self) -> ActivitySnapshot: ...

    async def sleep(self, level: int, mode: str = "wait", *, timeout: float = 120.0) -> None: ...  # noqa: ASYNC109

    async def wake(
        self,
        level: int,
        *,
        timeout: float = 300.0,  # noqa: ASYNC109
        staged: bool = False,
        done: Collection[str] = (),
        on_step: Callable[[str], Awaitable[None]] | None = None,
    ) -> None: ...

    async def is_sleeping(self) -> bool: ...

    async def aclose(self) -> None: ...


def engine_client(
    kind: str,
    base_url: str,
    *,
    client: EngineHttp,
    timeout: float,
    outstanding: Collection[str] = (),
    record: Record | None = None,
) -> SleepingEngine:
    """The client of an engine of `kind` (spec.engine.kind). An SGLang server's state is kept
    by its owner: `outstanding` is what was recorded as released or paused, `record` is told
    each change before it is made (engine/sglang.py)."""
    if kind == "sglang":
        return SGLangClient(
            base_url, client=client, timeout=timeout, outstanding=outstanding, record=record
        )
    return EngineClient(base_url, client=client, timeout=timeout)
