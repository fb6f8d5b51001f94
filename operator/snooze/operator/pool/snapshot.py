"""What a model's loop shows a GPU pool: a snapshot of its pods on the pool's device, and of
what the loop knows of each engine, taken when the pool asks. The pool reads the snapshot only,
never the loop's live state, which its actions change while the pool decides."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from snooze.api.models import EngineState, InferenceModelSpec
from snooze.kube.pods import PodInfo, pool_name_of
from snooze.operator.memory import EngineMemory, process_of
from snooze.policy.runs import Process


@dataclass(frozen=True, kw_only=True)
class EngineFacts:
    """One engine as its model's loop knows it at the snapshot's instant."""

    sleeping: bool | None
    """Its own answer at the last probe (None: no answer)."""
    acting: str | None
    """The kind of the action under way on it (Sleep, Wake...), if any."""
    last_failure_reason: str
    last_failure: float | None
    sleep_level: int | None
    gpu_share: float | None
    awake_since: float | None
    """When it last became awake."""
    sleep_started: float | None
    """When its latest drain began (a mark of a sleep of Snooze's)."""
    busy: bool
    busy_at: float | None
    last_probe: float | None
    direct_activity: bool
    last_activity: float
    recent_requests: int
    host_copy: bool
    """Its engine run keeps a pinned copy of its weights (seen asleep at level 1)."""
    sleeps_at: Mapping[int, int | None]
    """The level it sleeps at for each level asked, as known bugs and its release move it."""
    levels_known: bool = False
    """Whether what moves its levels is read for this run: a vLLM engine's release, an SGLang
    server's arguments."""

    @classmethod
    def of(cls, engine: EngineMemory, pod: PodInfo, process: Process, now: float) -> EngineFacts:
        return cls(
            sleeping=engine.sleeping,
            acting=engine.acting_kind,
            last_failure_reason=engine.last_failure_reason,
            last_failure=engine.last_failure,
            sleep_level=engine.sleep_level,
            gpu_share=engine.gpu_share,
            awake_since=engine.state_since.get(EngineState.AWAKE.value),
            sleep_started=engine.sleep_started_of(pod),
            busy=engine.busy,
            busy_at=engine.busy_at,
            last_probe=engine.last_probe,
            direct_activity=engine.direct_activity,
            last_activity=engine.last_activity,
            recent_requests=engine.recent_requests(now),
            host_copy=engine.holds_host_copy(process),
            sleeps_at=dict(engine.sleeps_at),
            levels_known=any(
                known is not None and known[0].same_as(process)
                for known in (engine.version, engine.server_info)
            ),
        )


@dataclass(frozen=True, kw_only=True)
class PodSnapshot:
    """One of the model's pods on the pool's device."""

    pod: PodInfo
    process: Process
    """The engine run it holds (what a host copy or a distrust belongs to)."""
    engine: EngineFacts | None
    """None: the loop has not followed its engine yet."""


@dataclass(frozen=True, kw_only=True)
class ModelSnapshot:
    """A model's loop, as one GPU pool sees it at one instant."""

    name: str
    cycled: bool
    """Its first cycle has run, so `pods` says which pods it has."""
    spec: InferenceModelSpec | None
    """Its last valid spec."""
    min_awake_now: int
    """The engines it keeps awake now: minAwake, or its keep-awake window's."""
    last_wake_seconds: float | None
    pods: Sequence[PodSnapshot]
    poke: Callable[[], None]
    """Make its loop look again now (the pool told one of its members something new)."""


class MemberSource(Protocol):
    """A model's loop, as a pool reaches it (operator/model/loop.py's ModelLoop)."""

    def snapshot(self, *, pool: str, claims: Mapping[str, str], now: float) -> ModelSnapshot:
        """Its pods that are members of `pool` (`claims`: ResourceClaim -> pool), now."""
        ...


def take_snapshot(
    *,
    name: str,
    cycled: bool,
    spec: InferenceModelSpec | None,
    min_awake_now: int,
    last_wake_seconds: float | None,
    selected: Sequence[PodInfo],
    engines: Mapping[str, EngineMemory],
    poke: Callable[[], None],
    pool: str,
    claims: Mapping[str, str],
    now: float,
) -> ModelSnapshot:
    """A model loop's snapshot for `pool`: its pods there that are on a node (a Pending pod
    holds nothing on the device yet), each with a copy of what the loop knows of its engine."""
    port = spec.engine.port if spec is not None else None
    pods = []
    for pod in selected:
        if pool_name_of(pod, spec, claims) != pool or not pod.scheduled:
            continue
        process = process_of(pod, port)
        engine = engines.get(pod.name)
        facts = None if engine is None else EngineFacts.of(engine, pod, process, now)
        pods.append(PodSnapshot(pod=pod, process=process, engine=facts))
    return ModelSnapshot(
        name=name,
        cycled=cycled,
        spec=spec,
        min_awake_now=min_awake_now,
        last_wake_seconds=last_wake_seconds,
        pods=tuple(pods),
        poke=poke,
    )
