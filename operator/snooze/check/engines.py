"""`snooze check --engine URL`: each engine found out for what it is (vLLM by its /version, SGLang
by its /server_info: one entry of KINDS each), then checked by its kind; the engines side by
side."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from snooze.check import sglangengine, vllmengine, vllmjudge
from snooze.check.asking import Asked, answer_said
from snooze.check.cycle import EngineOptions
from snooze.check.report import Kind, Result, Subject, failure
from snooze.check.vllmjudge import PodSeen
from snooze.engine.http import EngineHttp

__all__ = ["KINDS", "EngineKind", "EngineOptions", "check_engines"]


@dataclass(frozen=True)
class EngineKind:
    """An engine Snooze speaks to, as `snooze check` finds and checks one."""

    name: str
    identify: Callable[[EngineHttp, str, float], Awaitable[tuple[str | None, Asked]]]
    """Its release at the URL (None: not this kind; "": this kind, which would not say its
    release), and the answer that said so."""
    examine: Callable[..., Awaitable[list[Result]]]
    """Its checks, given that answer (`pod=`, `options=`)."""


KINDS: tuple[EngineKind, ...] = (
    EngineKind(name=vllmengine.NAME, identify=vllmengine.identify, examine=vllmengine.examine),
    EngineKind(
        name=sglangengine.NAME, identify=sglangengine.identify, examine=sglangengine.examine
    ),
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
    found = (
        vllmjudge.engine(subject, url, first)
        if not first.answered
        else neither(subject, url, first)
    )
    serve = [vllmjudge.serve_args_check(subject, pod)] if pod is not None else []
    return [found, *serve]


def neither(subject: Subject, url: str, version_answer: Asked) -> Result:
    """The `engine` check of a URL that answers as no kind Snooze speaks to."""
    return failure(
        subject,
        "engine",
        f"{url} answers, but neither as vLLM (/version answered {answer_said(version_answer)}) "
        "nor as SGLang (no /server_info of its own)",
        "point --engine at a vLLM server's port (8000 unless --port says otherwise) or an "
        "SGLang server's (30000 unless --port says otherwise)",
    )


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
