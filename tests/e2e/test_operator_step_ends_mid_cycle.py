"""Steps and cycles that overlap while the pod index lags behind the operator's own writes.

A step that ends while a model's cycle probes its other engines: the cycle must judge every
engine as it was when the cycle began, not mix an engine's finished step with a probe older
than that step. Two engines of one model sleep (or wake) together, as in the sandbox
walkthrough; one step ends while the cycle probes the other engine, and the pod index still
shows the step's label and marks. And a cycle during a drain, while the index still shows the
previous sleep's mark, must not take an older wake request for a new one."""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

import httpx
import pytest

from snooze.api.agreed import STATE_LABEL, WAKE_REQUESTED_ANNOTATION
from snooze.api.times import format_time
from snooze.engine.client import new_http_client
from snooze.engine.http import Answer, EngineHttp
from snooze.engine.probe import Prober
from snooze.kube.api import KubeApi, Ref
from snooze.kube.pods import PodInfo
from snooze.operator.metrics import OperatorMetrics
from snooze.operator.model.loop import ModelLoop
from snooze.operator.settings import Settings
from snooze.sim import EngineConfig, SimulatedEngine, SimulatorHost

from .conftest import _addresses

LABELS = {"app.kubernetes.io/name": "chat"}


def chat_engine(**options: Any) -> EngineConfig:
    """An engine of model chat, whose weights' digests (taken at its first sleep) are quick."""
    return EngineConfig(
        model="chat", host=next(_addresses), port=8000, checksum_seconds_per_gib=0.001, **options
    )


class RecordingApi:
    """The Kubernetes API as the loop sees it: every patch recorded, none refused."""

    def __init__(self) -> None:
        self.patches: list[tuple[str, dict[str, Any]]] = []

    async def patch(
        self, ref: Ref, name: str, body: dict[str, Any], *, sub: str = "", yield_to: Any = None
    ) -> Any:
        self.patches.append((name, body))
        return {}


class GatedProber(Prober):
    """Runs `first` before the probe of the engine at `host` goes out."""

    def __init__(self, host: str, first: Any) -> None:
        super().__init__()
        self.host, self.first = host, first

    async def _get(self, base_url: str, path: str, *args: Any, **kwargs: Any) -> Answer:
        if httpx.URL(base_url).host == self.host and path.rstrip("/") == "/metrics":
            await self.first()
        return await super()._get(base_url, path, *args, **kwargs)


def chat_pod(index: int, engine: SimulatedEngine, state: str, **fields: Any) -> PodInfo:
    """Pod chat-`index` of `engine`, Ready, labelled `state`, as the pod index shows it."""
    return PodInfo(
        namespace="default",
        name=f"chat-{index}",
        uid=f"u{index}",
        labels={**LABELS, STATE_LABEL: state},
        ip=engine.config.host,
        ready=True,
        **fields,
    )


def chat_loop(
    body: dict[str, Any],
    pods: list[PodInfo],
    api: RecordingApi,
    prober: Prober,
    http: EngineHttp,
    events: list[tuple[str, str, str]],
) -> ModelLoop:
    """The loop of model `chat` on these pods (the pod index, frozen), its Events in `events`."""
    return ModelLoop(
        namespace="default",
        name="chat",
        body=body,
        pods=lambda _: pods,
        api=cast(KubeApi, api),
        prober=prober,
        action_http=http,
        settings=Settings(probe_interval=2),
        emit=lambda kind, reason, message: events.append((kind, reason, message)),
        metrics=OperatorMetrics(),
    )


@pytest.mark.parametrize("step", ["sleep", "wake"])
def test_a_step_that_ends_while_the_cycle_probes_is_left_to_end(
    sim: SimulatorHost, step: str
) -> None:
    """Before the fix, the ended sleep was taken for a drain cut off and sent again (a second
    Draining and Slept, the pod draining a moment), and the ended wake for a waking label
    left over, relabelled asleep (the gateway stopped routing to an awake engine)."""
    other = sim.add(chat_engine())
    ending = sim.add(chat_engine(sleep_seconds=0.01))
    if step == "sleep":
        httpx.post(f"http://{ending.config.host}:8000/sleep?level=1&mode=wait").raise_for_status()
    now = time.time()
    # As the pod index still shows chat-1: the step's label (and a drain's marks), though the
    # operator has since written the outcome (the watch event is on its way).
    marks = {"sleep_started": now - 6, "sleep_sent": now - 5.9} if step == "sleep" else {}
    pods = [
        chat_pod(0, other, "awake"),
        chat_pod(1, ending, "draining" if step == "sleep" else "waking", **marks),
    ]
    body = {
        "metadata": {"name": "chat", "namespace": "default", "generation": 1},
        "spec": {"selector": {"matchLabels": LABELS}, "idle": {"after": "1h"}},
    }
    events: list[tuple[str, str, str]] = []
    api = RecordingApi()

    async def main() -> None:
        finish = asyncio.Event()
        loop: ModelLoop

        async def rest_of_the_step() -> None:
            await finish.wait()  # chat-1's last label and its Event

        async def end_the_step() -> None:
            finish.set()
            task = loop.memory.engines["chat-1"].task
            assert task is not None
            await task

        prober = GatedProber(other.config.host, end_the_step)
        async with new_http_client() as http:
            loop = chat_loop(body, pods, api, prober, http, events)
            # chat-0 is due a probe; chat-1 was last probed before its step began.
            for name in ("chat-0", "chat-1"):
                engine = loop.memory.engine(name, now=now)
                engine.answered, engine.sleeps_in_flight = True, 0
                engine.sleeping = name == "chat-1" and step == "wake"
                engine.last_probe = None if name == "chat-0" else now - 6
            chat1 = loop.memory.engines["chat-1"]
            chat1.action, chat1.task = step, asyncio.create_task(rest_of_the_step())
            await loop.cycle()
            for engine in loop.memory.engines.values():
                if engine.task is not None:
                    await engine.task
        await prober.aclose()

    asyncio.run(main())
    labels = [
        (name, body["metadata"]["labels"][STATE_LABEL])
        for name, body in api.patches
        if "labels" in body.get("metadata", {})
    ]
    assert [label for label in labels if label[0] == "chat-1"] == [], (labels, events)
    assert events == []
    assert ending.is_sleeping is (step == "sleep")


class VersioningApi(RecordingApi):
    """Each patch makes a new version of the object, as the API server does."""

    version = 40

    async def patch(
        self, ref: Ref, name: str, body: dict[str, Any], *, sub: str = "", yield_to: Any = None
    ) -> Any:
        await super().patch(ref, name, body, sub=sub)
        self.version += 1
        return {"metadata": {"resourceVersion": str(self.version)}}


class DrainGate(EngineHttp):
    """The operator's engine requests, the drain check held until `release` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.checking = asyncio.Event()
        self.release = asyncio.Event()

    async def request(self, method: str, url: str, **kwargs: Any) -> Answer:
        if method == "GET" and url.rstrip("/").endswith("/metrics"):
            self.checking.set()
            await self.release.wait()
        return await super().request(method, url, **kwargs)


def test_a_drain_is_not_cancelled_by_a_wake_request_older_than_it(sim: SimulatorHost) -> None:
    """A model woken by a request earlier falls idle and drains; a cycle during the drain (a
    poke: in a GPU pool, the pool's next decision) reads the pod index, which still shows the
    previous sleep's mark. Before the fix the old wake request looked newer than the drain,
    which was cancelled ("the model is wanted"): a member a pool was putting to sleep to make
    room stayed awake, and the wake waiting for that room waited for another choice."""
    engine = sim.add(chat_engine(sleep_seconds=0.01))
    now = time.time()
    pods = [
        chat_pod(
            0,
            engine,
            "awake",
            sleep_started=now - 100,  # its previous sleep, before the wake below
            resource_version="40",  # and the index stays at this version: it lags
        )
    ]
    body = {
        "metadata": {
            "name": "chat",
            "namespace": "default",
            "generation": 1,
            "annotations": {WAKE_REQUESTED_ANNOTATION: format_time(now - 50)},
        },
        "spec": {"selector": {"matchLabels": LABELS}, "idle": {"after": "1s"}},
    }
    events: list[tuple[str, str, str]] = []
    api = VersioningApi()

    async def main() -> None:
        prober = Prober()
        async with DrainGate() as http:
            loop = chat_loop(body, pods, api, prober, http, events)
            state = loop.memory.engine("chat-0", now=now)
            state.answered, state.sleeps_in_flight, state.sleeping = True, 0, False
            state.last_activity = now - 10  # idle for longer than idle.after
            await loop.cycle()  # decides the sleep; its drain check is held
            await asyncio.wait_for(http.checking.wait(), 5)
            await loop.cycle()  # a poke while the drain runs
            http.release.set()
            task = state.task
            assert task is not None
            await task
        await prober.aclose()

    asyncio.run(main())
    reasons = [reason for _, reason, _ in events]
    assert "SleepCancelled" not in reasons, events
    assert reasons.count("Draining") == 1 and "Slept" in reasons, events
    assert engine.is_sleeping
