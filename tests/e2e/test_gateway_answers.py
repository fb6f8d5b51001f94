"""Answers of any size pass through the gateway without its memory growing with them: an
engine stand-in (benchmarks/hostile_engines.py, a process of its own) answers 300 MB, or
without end, through a real `snooze gateway` process, whose resident memory is read from
/proc beside a control answer of the same run. The client gets the whole answer (or as much
as it reads), and another tenant's model is served meanwhile."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from processes import GatewayProcess as Gateway
from processes import running_gateway
from stand_in import write_status
from waits import wait_for

from snooze.sandbox import Sandbox
from snooze.sim import SimulatorHost

from .conftest import Cluster, next_address
from .test_gateway import MESSAGES
from .test_hostile_engines import Hostiles

HUGE = 300_000_000
TAIL = b'","finish_reason":"length"}]}'
MIB = 1 << 20
# The gateway's peak resident memory while it passes a 300 MB answer on, against its peak
# while it passes an ordinary one (it read the whole answer first: 70 MiB became 946 MiB).
MOST_MEMORY_RATIO = 1.5


@pytest.fixture
def hostiles(tmp_path: Path) -> Iterator[Hostiles]:
    engines = Hostiles(tmp_path / "hostile-engines.log")
    yield engines
    engines.stop()


@pytest.fixture
def gateway_process(sandbox: Sandbox, tmp_path: Path) -> Iterator[Gateway]:
    with running_gateway(tmp_path / "gateway.log") as process:
        yield process


def hostile_model(cluster: Cluster, hostiles: Hostiles, name: str, **answer: object) -> str:
    """A model whose one pod is a hostile engine answering as `answer` says; the status the
    operator would write, awake."""
    host = hostiles.serve(next_address(), kind="page", text="", **answer)
    cluster.add_pod(f"{name}-0", labels={"app": name, "snooze.dev/state": "awake"}, ip=host)
    cluster.create_model(name, {"selector": {"matchLabels": {"app": name}}})
    write_status(cluster, name, model_name=name, pods={f"{name}-0": "awake"})
    return host


@pytest.fixture
def tenant(sandbox: Sandbox, sim: SimulatorHost) -> Iterator[Cluster]:
    """Another tenant's namespace, with a model of its own, `calm`, awake."""
    other = Cluster(sandbox, sim, namespace="tenant-b")
    other.create_pod("calm-0", labels={"app": "calm", "snooze.dev/state": "awake"}, model="calm")
    other.create_model("calm", {"selector": {"matchLabels": {"app": "calm"}}})
    write_status(other, "calm", model_name="calm", pods={"calm-0": "awake"})
    yield other
    other.close()


def chat(gateway: Gateway, model: str) -> httpx.Response:
    body = {"model": model, "messages": MESSAGES, "max_tokens": 4}
    return httpx.post(gateway.url + "/v1/chat/completions", json=body, timeout=30)


class Reader(threading.Thread):
    """A client reading an answer to the end, or up to `most` bytes, and keeping nothing but
    its length, its status and its last bytes."""

    def __init__(self, gateway: Gateway, model: str, most: int | None = None) -> None:
        super().__init__(daemon=True)
        self.url = gateway.url + "/v1/completions"
        self.body = {"model": model, "prompt": "everything", "max_tokens": 10**6}
        self.most = most
        self.status = 0
        self.length = 0
        self.last = b""
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with httpx.stream("POST", self.url, json=self.body, timeout=30) as answer:
                self.status = answer.status_code
                for chunk in answer.iter_raw(MIB):
                    self.length += len(chunk)
                    self.last = (self.last + chunk)[-64:]
                    if self.most is not None and self.length >= self.most:
                        return
        except BaseException as exc:  # reported by the test
            self.error = exc


def peak_while(gateway: Gateway, reader: Reader, limit: int) -> int:
    """The gateway's peak memory while `reader` (started) reads; stops early (the test then
    fails) once it passes `limit`, rather than let a gateway that holds the answer take the
    machine's memory."""
    while reader.is_alive():
        if gateway.memory()["VmHWM"] > limit:
            return gateway.memory()["VmHWM"]
        time.sleep(0.05)
    return gateway.memory()["VmHWM"]


def control_peak(gateway: Gateway, tenant: Cluster) -> int:
    """The gateway's peak memory over ordinary answers, once it has served a few (its
    allocations made)."""
    for _ in range(5):
        assert chat(gateway, "calm").status_code == 200
    gateway.reset_peak()
    for _ in range(5):
        assert chat(gateway, "calm").status_code == 200
    return gateway.memory()["VmHWM"]


def served_meanwhile(gateway: Gateway, reader: Reader) -> list[int]:
    """The other tenant's requests while `reader` reads: their statuses."""
    codes = []
    while reader.is_alive() or not codes:
        codes.append(chat(gateway, "calm").status_code)
    return codes


def test_a_300_mb_answer_passes_through_as_it_comes(
    cluster: Cluster, hostiles: Hostiles, tenant: Cluster, gateway_process: Gateway
) -> None:
    hostile_model(cluster, hostiles, "huge", answer="huge", bytes=HUGE, length=True)
    wait_for("both models routable", lambda: gateway_process.routable("huge")
             and gateway_process.routable("calm"))  # fmt: skip
    control = control_peak(gateway_process, tenant)

    reader = Reader(gateway_process, "huge")
    codes: list[int] = []
    meanwhile = threading.Thread(
        target=lambda: codes.extend(served_meanwhile(gateway_process, reader)), daemon=True
    )
    gateway_process.reset_peak()
    reader.start()
    meanwhile.start()
    peak = peak_while(gateway_process, reader, limit=int(control * MOST_MEMORY_RATIO))
    reader.join(120)
    meanwhile.join(60)
    figures = {"control_mib": control / MIB, "peak_mib": peak / MIB, "ratio": peak / control}
    assert peak / control < MOST_MEMORY_RATIO, figures
    assert reader.error is None, reader.error
    assert (reader.status, reader.length) == (200, HUGE), figures
    assert reader.last.endswith(TAIL)
    assert codes and set(codes) == {200}, codes


def test_three_300_mb_answers_at_once_cost_no_more_than_one(
    cluster: Cluster, hostiles: Hostiles, tenant: Cluster, gateway_process: Gateway
) -> None:
    """Three at once took the gateway to 2,348 MiB when it held each answer whole: two such
    answers were enough to have the chart's 1 GiB limit kill it, and every tenant's requests
    with it. Passed on as they come, three cost what one costs."""
    hostile_model(cluster, hostiles, "huge", answer="huge", bytes=HUGE, length=True)
    wait_for("both models routable", lambda: gateway_process.routable("huge")
             and gateway_process.routable("calm"))  # fmt: skip
    control = control_peak(gateway_process, tenant)

    readers = [Reader(gateway_process, "huge") for _ in range(3)]
    gateway_process.reset_peak()
    for reader in readers:
        reader.start()
    limit = int(control * MOST_MEMORY_RATIO)
    peak = max(peak_while(gateway_process, reader, limit) for reader in readers)
    for reader in readers:
        reader.join(120)
    figures = {"control_mib": control / MIB, "peak_mib": peak / MIB, "ratio": peak / control}
    assert peak / control < MOST_MEMORY_RATIO, figures
    for reader in readers:
        assert reader.error is None, reader.error
        assert (reader.status, reader.length) == (200, HUGE), figures
        assert reader.last.endswith(TAIL)
    assert chat(gateway_process, "calm").status_code == 200  # the gateway lives on


def test_an_endless_answer_costs_no_more_and_ends_when_its_client_leaves(
    cluster: Cluster, hostiles: Hostiles, tenant: Cluster, gateway_process: Gateway
) -> None:
    host = hostile_model(cluster, hostiles, "endless", answer="endless")
    wait_for("both models routable", lambda: gateway_process.routable("endless")
             and gateway_process.routable("calm"))  # fmt: skip
    control = control_peak(gateway_process, tenant)

    reader = Reader(gateway_process, "endless", most=HUGE)
    gateway_process.reset_peak()
    reader.start()
    peak = peak_while(gateway_process, reader, limit=int(control * MOST_MEMORY_RATIO))
    reader.join(120)
    figures = {"control_mib": control / MIB, "peak_mib": peak / MIB, "ratio": peak / control}
    assert peak / control < MOST_MEMORY_RATIO, figures
    assert reader.error is None, reader.error
    assert reader.status == 200 and reader.length >= HUGE
    # The client left: the gateway let the engine go, and counts nothing in flight to it.
    wait_for("the engine's answer given up", lambda: hostiles.seen(host)["open"] == 0)
    wait_for("nothing in flight", lambda: gateway_process.in_flight("endless-0") == 0)
    assert chat(gateway_process, "calm").status_code == 200
