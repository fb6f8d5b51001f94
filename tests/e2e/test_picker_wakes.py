"""Requests queued at an Inference Extension endpoint picker wake their model: the real operator
process (`snooze operator --inference-gateway`) reads the stand-in picker of the InferencePool
that selects the model's pods, with its token, and asks for one wake per burst, as a request held
at Snooze's gateway does; the model stays awake while requests wait. A picker that cannot be
read, or lies, is named on the model's status and stops nothing else. Without the
InferencePool CRD nothing is polled but discovery, and a CRD installed later is served."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from picker_stand_in import PickerMetrics, create_picker_service, create_pool, install_crd
from processes import Process
from waits import wait_for

from snooze.demo.controller import ReplicaSetStandIn, deployment
from snooze.sim import SimulatedEngine

from .conftest import Cluster, _addresses, next_address

TOKEN = "snooze-picker-reader-token"
WAKE = "snooze.dev/wake-requested-at"


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    return path


@pytest.fixture
def pickers() -> Iterator[list[PickerMetrics]]:
    made: list[PickerMetrics] = []
    yield made
    for picker in made:
        picker.stop()


def start_operator(tmp_path: Path, token_file: Path) -> Process:
    return Process(
        tmp_path / "operator.log",
        "operator",
        "--probe-interval",
        "0.3",
        "--drain-timeout",
        "2",
        "--inference-gateway",
        "--picker-interval",
        "0.2",
        "--picker-token-file",
        str(token_file),
    )


def model_behind_a_pool(
    cluster: Cluster,
    pickers: list[PickerMetrics],
    name: str,
    *,
    token: str = TOKEN,
    idle: str = "1s",
) -> tuple[SimulatedEngine, PickerMetrics]:
    """A model of one engine, an InferencePool selecting its pod, and that pool's picker."""
    labels = {"app": name}
    engine = cluster.create_pod(f"{name}-0", labels=labels, model=name)
    picker = PickerMetrics(next_address(), 9090, token=token)
    pickers.append(picker)
    create_picker_service(cluster, f"{name}-epp", [picker.server.server_address[0]], port=9090)
    create_pool(cluster, f"{name}-pool", selector=labels, picker=f"{name}-epp")
    spec = {"modelName": name, "selector": {"matchLabels": labels}, "idle": {"after": idle}}
    cluster.create_model(name, spec)
    return engine, picker


def readable(cluster: Cluster, model: str) -> tuple[str, str] | None:
    condition = cluster.condition(model, "PickerReadable")
    return None if condition is None else (condition["status"], condition["reason"])


def test_a_queue_at_the_picker_wakes_its_model_once_and_keeps_it_awake(
    cluster: Cluster, pickers: list[PickerMetrics], tmp_path: Path, token_file: Path
) -> None:
    install_crd(cluster)
    engine, picker = model_behind_a_pool(cluster, pickers, "qwen")
    operator = start_operator(tmp_path, token_file)
    try:
        wait_for("asleep", lambda: engine.is_sleeping, timeout=30)
        wait_for("the picker read", lambda: readable(cluster, "qwen") == ("True", "Read"))
        # Requests for another model, queued at the same picker, are not this model's.
        picker.queued[("qwen-other", "", "0")] = 5
        # A sleep: proves another model's queue wakes nothing, for a second (ten probes).
        time.sleep(1.0)
        assert engine.wake_calls == 0 and engine.is_sleeping

        # A burst: requests of two tenants at two priorities.
        picker.queued[("qwen", "tenant-a", "0")] = 2
        picker.queued[("qwen", "tenant-b", "-1")] = 1
        wait_for("awake", lambda: not engine.is_sleeping, timeout=10)
        asked = cluster.model("qwen")["metadata"]["annotations"][WAKE]
        wait_for("the pod labelled awake", lambda: cluster.pod_state("qwen-0") == "awake")
        # idle.after is 1 s: only the queue keeps it awake, and it asks for no second wake.
        # A sleep: proves the queue alone keeps it awake for 3 s (past idle.after), with no second
        # wake.
        time.sleep(3.0)
        assert not engine.is_sleeping and engine.wake_calls == 1
        assert cluster.model("qwen")["metadata"]["annotations"][WAKE] == asked
        [told] = cluster.events("WakeRequested")
        assert "3 request(s) queued" in told["message"] and "qwen-pool" in told["message"]

        # The picker dispatched its queue: the model sleeps once idle, and a new burst wakes
        # it again, once.
        del picker.queued[("qwen", "tenant-a", "0")], picker.queued[("qwen", "tenant-b", "-1")]
        wait_for("asleep again", lambda: engine.is_sleeping, timeout=10)
        picker.queued[("qwen", "", "0")] = 1
        wait_for("awake again", lambda: not engine.is_sleeping, timeout=10)
        # A sleep: proves one queued request gives one wake, for a second.
        time.sleep(1.0)
        assert engine.wake_calls == 2
        assert len(cluster.events("WakeRequested")) == 2
        # Every scrape carried the operator's token: none went without it.
        assert picker.asked["accepted"] > 10 and picker.asked["no token"] == 0
        assert operator.popen.poll() is None
    finally:
        operator.stop()


HOSTILE = {
    # model: (what its picker does, the reason its status gives)
    "huge": ("huge", "AnswerTooLarge"),
    "endless": ("endless", "Timeout"),
    "garbage": ("garbage", "InvalidAnswer"),
    "nan": ("nan", "InvalidAnswer"),
    "stranger": ("another token", "Unauthorized"),
    "forbidden": ("forbidden", "Forbidden"),
}


def test_pickers_that_cannot_be_read_are_named_and_stop_nothing(
    cluster: Cluster, pickers: list[PickerMetrics], tmp_path: Path, token_file: Path
) -> None:
    install_crd(cluster)
    for name, (mode, _) in HOSTILE.items():
        _, picker = model_behind_a_pool(cluster, pickers, name, idle="1h")
        picker.queued[(name, "", "0")] = 4
        if mode == "another token":
            picker.token = "another"
        elif mode == "forbidden":
            picker.forbidden.add(TOKEN)
            picker.token = "another"
        else:
            picker.mode = mode
    # A picker with no ready endpoint; a pool whose picker is no Service; one whose Service
    # does not exist.
    labels = {"app": "down"}
    cluster.create_pod("down-0", labels=labels, model="down")
    create_picker_service(cluster, "down-epp", [next_address()], port=9090, ready=False)
    create_pool(cluster, "down-pool", selector=labels, picker="down-epp")
    cluster.create_model("down", {"modelName": "down", "selector": {"matchLabels": labels}})
    cluster.create_pod("gw-0", labels={"app": "gw"}, model="gw")
    create_pool(cluster, "gw-pool", selector={"app": "gw"}, picker="gw-epp", kind="Gateway")
    cluster.create_model("gw", {"modelName": "gw", "selector": {"matchLabels": {"app": "gw"}}})
    cluster.create_pod("gone-0", labels={"app": "gone"}, model="gone")
    create_pool(cluster, "gone-pool", selector={"app": "gone"}, picker="gone-epp")
    cluster.create_model(
        "gone", {"modelName": "gone", "selector": {"matchLabels": {"app": "gone"}}}
    )
    # And one whose EndpointSlice, written by hand, points at an address no pod has: the
    # operator sends nothing there.
    stray = PickerMetrics(next_address(), 9090, token=TOKEN)
    pickers.append(stray)
    stray.queued[("stray", "", "0")] = 2
    cluster.create_pod("stray-0", labels={"app": "stray"}, model="stray")
    create_picker_service(
        cluster, "stray-epp", [stray.server.server_address[0]], port=9090, pods=False
    )
    create_pool(cluster, "stray-pool", selector={"app": "stray"}, picker="stray-epp")
    cluster.create_model(
        "stray", {"modelName": "stray", "selector": {"matchLabels": {"app": "stray"}}}
    )
    # And beside them all, a model whose picker is fine.
    good, good_picker = model_behind_a_pool(cluster, pickers, "good")

    operator = start_operator(tmp_path, token_file)
    try:
        expected = {name: reason for name, (_, reason) in HOSTILE.items()}
        expected |= {
            "down": "NoEndpoints",
            "gw": "InvalidPool",
            "gone": "PickerNotFound",
            "stray": "NotAPod",
        }
        for name, reason in expected.items():
            wait_for(
                f"{name}'s picker named",
                lambda name=name, reason=reason: readable(cluster, name) == ("False", reason),
                timeout=30,
            )
        message = cluster.condition("huge", "PickerReadable")["message"]
        assert "huge-pool" in message and "more than is read" in message
        said = cluster.condition("forbidden", "PickerReadable")["message"]
        assert "nonResourceURLs [/metrics]" in said

        # None of them woke their model, and the loop goes on: the good one sleeps when idle
        # and wakes when its picker queues a request, sooner than the endless page's timeout
        # (5 s): a picker that answers slowly holds up no other.
        wait_for("the good one asleep", lambda: good.is_sleeping, timeout=15)
        good_picker.queued[("good", "", "0")] = 1
        wait_for("the good one awake", lambda: not good.is_sleeping, timeout=4.5)
        assert readable(cluster, "good") == ("True", "Read")
        for name in [*HOSTILE, "stray"]:
            assert cluster.engines[f"{name}-0"].wake_calls == 0
        assert sum(stray.asked.values()) == 0
        assert operator.popen.poll() is None
        assert "Traceback" not in operator.output()
    finally:
        operator.stop()


def test_without_the_crd_only_discovery_is_asked_until_it_is_installed(
    cluster: Cluster, pickers: list[PickerMetrics], tmp_path: Path, token_file: Path
) -> None:
    labels = {"app": "late"}
    engine = cluster.create_pod("late-0", labels=labels, model="late")
    spec = {"modelName": "late", "selector": {"matchLabels": labels}, "idle": {"after": "1s"}}
    cluster.create_model("late", spec)
    operator = start_operator(tmp_path, token_file)
    try:
        wait_for("asleep", lambda: engine.is_sleeping, timeout=30)
        discovery = "/apis/inference.networking.k8s.io/v1"
        before = cluster.sandbox.requests_count("GET", discovery)
        # A sleep: counts the discovery requests of 3 s; what is asserted is their rate.
        time.sleep(3.0)
        asked = cluster.sandbox.requests_count("GET", discovery) - before
        # Once per probe interval (0.3 s), not in a loop; never a list of what is not served.
        assert 3 <= asked <= 3.0 / 0.3 + 2, asked
        assert cluster.sandbox.requests_count(None, "inferencepools") == 0
        assert cluster.condition("late", "PickerReadable") is None
        wait_for(
            "the wait said once",
            lambda: operator.output().count("InferencePools (inferencepools") == 1,
        )

        install_crd(cluster)
        picker = PickerMetrics(next_address(), 9090, token=TOKEN)
        pickers.append(picker)
        create_picker_service(cluster, "late-epp", [picker.server.server_address[0]], port=9090)
        create_pool(cluster, "late-pool", selector=labels, picker="late-epp")
        picker.queued[("late", "", "0")] = 1
        wait_for("woken through the pool installed later", lambda: not engine.is_sleeping)
        assert readable(cluster, "late") == ("True", "Read")
    finally:
        operator.stop()


def test_a_queue_brings_a_model_back_from_zero_replicas(
    cluster: Cluster, pickers: list[PickerMetrics], tmp_path: Path, token_file: Path
) -> None:
    """At zero replicas no pod is left for the pool to select: the pods its workload will make
    are, and the picker's queue scales the workload back up as a held request does."""
    install_crd(cluster)
    labels = {"app": "chat"}
    stand_in = ReplicaSetStandIn(
        url=cluster.sandbox.url, sim=cluster.sim, addresses=_addresses, startup_seconds=0.3
    ).start()
    operator = start_operator(tmp_path, token_file)
    try:
        picker = PickerMetrics(next_address(), 9090, token=TOKEN)
        pickers.append(picker)
        create_picker_service(cluster, "chat-epp", [picker.server.server_address[0]], port=9090)
        create_pool(cluster, "chat-pool", selector=labels, picker="chat-epp")
        deployments = "/apis/apps/v1/namespaces/default/deployments"
        cluster.http.post(deployments, json=deployment("chat", replicas=1, labels=labels))
        spec = {
            "modelName": "m",
            "selector": {"matchLabels": labels},
            "scaleTargetRef": {"kind": "Deployment", "name": "chat"},
            "idle": {"after": "1s"},
            "scaleToZeroAfter": "2s",
            "wake": {"coldStartTimeout": "30s"},
        }
        cluster.create_model("chat", spec)
        wait_for(
            "at zero", lambda: cluster.status("chat").get("phase") == "ScaledToZero", timeout=30
        )
        wait_for("no pod left", lambda: not stand_in.engines, timeout=10)
        picker.queued[("m", "", "0")] = 1
        wait_for(
            "awake from zero", lambda: cluster.status("chat").get("phase") == "Awake", timeout=30
        )
        assert len(cluster.events("WakeRequested")) == 1
    finally:
        operator.stop()
        stand_in.stop()
