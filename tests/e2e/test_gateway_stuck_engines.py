"""An engine that takes requests and starts none (asleep while the operator's view says awake,
as when its metrics lie) fails them fast: after --upstream-start-timeout (a second here)
rather than the first-byte timeout's ten minutes, with a 502 that says so; it then gets no
request for a while (another pod of its model gets them; with none, a 502 at once, with
Retry-After), and the gateway's page counts it for the operator, which then asks the engine,
relabels it asleep, and wakes it for the next request. An engine busy with other
requests is not stuck, however long one request waits in its queue, nor one whose answer
comes whole after a long generation. The gateway is a `snooze gateway` process; the engines
are simulated, one of them put to sleep behind the operator's back (the test writes the
status the operator would)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from processes import GatewayProcess, running_gateway
from stand_in import write_status
from waits import wait_for

from snooze.gateway.bounds.stalls import AVOID_FIRST
from snooze.sandbox import Sandbox
from snooze.sim import SimulatedEngine

from .conftest import FAST, Cluster, OperatorThread
from .test_gateway import MESSAGES

START = 1.0
CHAT = "/v1/chat/completions"


@pytest.fixture
def gateway(sandbox: Sandbox, tmp_path: Path) -> Iterator[GatewayProcess]:
    with running_gateway(
        tmp_path / "gateway.log", "--upstream-start-timeout", f"{START}s"
    ) as process:
        yield process


# Not a manifest (tests/builders.py): creates the pods, their engines and the model.
def model(cluster: Cluster, name: str, pods: int = 1, **engine: Any) -> list[SimulatedEngine]:
    """A model of `pods` pods, awake, with the status the operator would write."""
    engines = []
    for i in range(pods):
        labels = {"app": name, "snooze.dev/state": "awake"}
        engines.append(cluster.create_pod(f"{name}-{i}", labels=labels, model=name, **engine))
    cluster.create_model(name, {"selector": {"matchLabels": {"app": name}}})
    write_status(cluster, name, model_name=name, pods={f"{name}-{i}": "awake" for i in range(pods)})
    return engines


def put_to_sleep(engine: SimulatedEngine) -> None:
    """Sleep the engine behind the operator's back: its pod stays published awake."""
    httpx.post(f"{engine.url}/sleep", params={"level": 1}, timeout=10).raise_for_status()
    assert engine.is_sleeping


def chat(
    gateway: GatewayProcess, name: str, *, stream: bool = False, tokens: int = 2
) -> tuple[httpx.Response, float]:
    """The answer, read whole, and how long it took."""
    body = {"model": name, "messages": MESSAGES, "max_tokens": tokens, "stream": stream}
    began = time.monotonic()
    answer = httpx.post(gateway.url + CHAT, json=body, timeout=30)
    return answer, time.monotonic() - began


def test_a_stream_to_an_engine_that_sleeps_behind_its_label_fails_fast(
    cluster: Cluster, gateway: GatewayProcess
) -> None:
    (engine,) = model(cluster, "liar")
    wait_for("routable", lambda: gateway.routable("liar"))
    put_to_sleep(engine)

    answer, took = chat(gateway, "liar", stream=True)
    assert answer.status_code == 502, answer.text
    error = answer.json()["error"]
    assert error["code"] == "upstream_stalled"
    assert "liar-0" in error["message"] and "--upstream-start-timeout" in error["message"]
    assert took < 10 * START, took  # not the first-byte timeout's ten minutes

    # Avoided now: answered at once, saying for how long, without reaching the engine.
    waiting = engine.waiting
    again, took_again = chat(gateway, "liar", stream=True)
    assert again.status_code == 502 and again.json()["error"]["code"] == "upstream_stalled"
    assert 0 < int(again.headers["Retry-After"]) <= AVOID_FIRST
    assert took_again < took
    assert engine.waiting == waiting
    assert gateway.sample("snooze_gateway_pod_stalls_total", pod="liar-0") == 1
    assert gateway.in_flight("liar-0") == 0


def test_an_answer_that_comes_whole_fails_fast_too(
    cluster: Cluster, gateway: GatewayProcess
) -> None:
    """Not streamed, an answer comes only after its whole generation, so its wait alone
    proves nothing: the gateway's own one-token stream to the engine tells."""
    (engine,) = model(cluster, "liar")
    wait_for("routable", lambda: gateway.routable("liar"))
    put_to_sleep(engine)
    answer, took = chat(gateway, "liar")
    assert answer.status_code == 502, answer.text
    assert answer.json()["error"]["code"] == "upstream_stalled"
    assert took < 10 * START, took
    assert gateway.sample("snooze_gateway_pod_stalls_total", pod="liar-0") == 1


def test_the_other_pods_of_the_model_serve_meanwhile(
    cluster: Cluster, gateway: GatewayProcess
) -> None:
    sleeper, _ = model(cluster, "pair", pods=2)
    wait_for("routable", lambda: gateway.routable("pair"))
    put_to_sleep(sleeper)
    codes = [chat(gateway, "pair", stream=True)[0].status_code for _ in range(6)]
    # At most one request (the one the gateway sent it first) waited on the sleeper.
    assert codes.count(502) <= 1 and codes.count(200) >= 5, codes
    assert gateway.in_flight("pair-0") == 0  # nothing left hanging there


def test_an_engine_busy_with_others_is_not_stuck(cluster: Cluster, gateway: GatewayProcess) -> None:
    """The control: an engine that runs one request at a time (the others wait in its queue,
    as behind a long prefill) makes a stream wait three start timeouts for its turn while
    another streams; and an answer that comes whole takes three start timeouts to generate
    (the gateway's probe of the engine is answered meanwhile). Both are served."""
    model(cluster, "busy", max_concurrency=1, token_seconds=0.03)
    model(cluster, "long", token_seconds=0.03)
    wait_for("routable", lambda: gateway.routable("busy") and gateway.routable("long"))
    body = {"model": "busy", "messages": MESSAGES, "max_tokens": 100, "stream": True}
    with httpx.stream("POST", gateway.url + CHAT, json=body, timeout=30) as first:
        assert first.status_code == 200
        queued, waited = chat(gateway, "busy", stream=True)  # its turn after the first's
    assert queued.status_code == 200, queued.text
    assert waited > 2 * START

    whole, took = chat(gateway, "long", tokens=100)
    assert whole.status_code == 200, whole.text
    assert took > 2 * START
    for pod in ("busy-0", "long-0"):
        assert gateway.sample("snooze_gateway_pod_stalls_total", pod=pod) == 0


@pytest.fixture
def operator(gateway: GatewayProcess) -> Iterator[OperatorThread]:
    """The operator, reading the gateway's page as the chart has it do, and probing an awake
    engine whose traffic the gateway counts only near its idle deadline (10 minutes here)
    or at the drift interval (made as long): what it learns sooner, a stall told it."""
    settings = replace(FAST, gateway_metrics=(gateway.metrics,), drift_interval=600.0)
    thread = OperatorThread(settings).start()
    yield thread
    thread.stop()


def test_an_engine_found_asleep_behind_its_label_is_relabelled_and_woken(
    cluster: Cluster, gateway: GatewayProcess, operator: OperatorThread
) -> None:
    """The gateway finds the engine stuck; the operator, told so by the gateway's page, asks
    the engine (/is_sleeping), relabels it asleep, and the next request wakes it."""
    engine = cluster.create_pod("napper-0", labels={"app": "napper"}, model="napper")
    cluster.create_model("napper", {"selector": {"matchLabels": {"app": "napper"}},
                                    "idle": {"after": "10m"}})  # fmt: skip
    wait_for("routable", lambda: gateway.routable("napper"), timeout=30)
    answer, _ = chat(gateway, "napper")
    assert answer.status_code == 200, answer.text
    put_to_sleep(engine)

    answer, _ = chat(gateway, "napper", stream=True)
    assert answer.status_code == 502, answer.text
    assert gateway.sample("snooze_gateway_pod_stalls_total", pod="napper-0") == 1
    wait_for("the pod relabelled asleep", lambda: cluster.pod_state("napper-0") == "asleep")

    # Not avoided any more (the operator's word explains the stall): held, woken, answered.
    answer, _ = chat(gateway, "napper")
    assert answer.status_code == 200, answer.text
    assert float(answer.headers["x-snooze-held-seconds"]) > 0
    assert not engine.is_sleeping
