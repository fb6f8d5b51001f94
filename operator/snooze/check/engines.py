"""`snooze check --engine URL`: each engine found out for what it is (vLLM today; another engine
is one more entry of KINDS), then checked by its kind; the engines side by side."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from snooze.check import vllmengine, vllmjudge
from snooze.check.asking import Asked
from snooze.check.report import Kind, Result, Subject
from snooze.check.vllmengine import EngineOptions
from snooze.check.vllmjudge import PodSeen
from snooze.engine.http import EngineHttp

__all__ = ["KINDS", "EngineKind", "EngineOptions", "check_engines"]


@dataclass(frozen=True)
class EngineKind:
    """An engine Snooze speaks to, as `snooze check` finds and checks one."""

    name: str
    identify: Callable[[EngineHttp, str, float], Awaitable[tuple[str | None, Asked]]]
    """Its release at the URL (None: not this kind), and the answer that said so."""
    examine: Callable[..., Awaitable[list[Result]]]
    """Its checks, given that answer (`pod=`, `options=`)."""


KINDS: tuple[EngineKind, ...] = (
    EngineKind(name=vllmengine.NAME, identify=vllmengine.identify, examine=vllmengine.examine),
)


async def check_engine(
    http: EngineHttp, url: str, *, pod: PodSeen | None, options: EngineOptions
) -> list[Result]:
    """The checks of the engine at `url`, by the first kind that knows it."""
    first: Asked | None = None
    for kind in KINDS:
        version, asked = await kind.identify(http, url, options.timeout)
        if version is not None:
            return await kind.examine(http, url, asked, pod=pod, options=options)
        first = first or asked
        if not asked.answered:
            break  # nothing answers there: no other kind will be found either
    assert first is not None
    subject = Subject(kind=Kind.ENGINE, name=url)
    found = vllmjudge.engine(subject, url, first)
    serve = [vllmjudge.serve_args_check(subject, pod)] if pod is not None else []
    return [found, *serve]


async def check_engines(
    urls: Sequence[str], pods: Sequence[PodSeen | None], options: EngineOptions
) -> list[Result]:
    """Every engine's checks, side by side, in the order given."""
    async with EngineHttp(limit=16) as http:
        found = await asyncio.gather(
            *(
                check_engine(http, url, pod=pod, options=options)
                for url, pod in zip(urls, pods, strict=True)
            )
        )
    return [result for results in found for result in results]
