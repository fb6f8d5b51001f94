"""The second tier end to end: asleep, then zero replicas, then back on request."""

from __future__ import annotations

import time
from collections.abc import Iterator

import openai
import pytest
from gateway_fixtures import GatewayThread
from waits import wait_for

from snooze.demo.controller import ReplicaSetStandIn, deployment

from .conftest import Cluster, OperatorThread, _addresses

LABELS = {"app": "chat"}
DEPLOYMENTS = "/apis/apps/v1/namespaces/default/deployments"


@pytest.fixture
def replicaset(cluster: Cluster) -> Iterator[ReplicaSetStandIn]:
    stand_in = ReplicaSetStandIn(
        url=cluster.sandbox.url, sim=cluster.sim, addresses=_addresses, startup_seconds=0.3
    ).start()
    yield stand_in
    stand_in.stop()


def replicas(cluster: Cluster, name: str = "chat") -> int:
    return int(cluster.http.get(f"{DEPLOYMENTS}/{name}").json()["spec"]["replicas"])


def scale(cluster: Cluster, count: int, name: str = "chat") -> None:
    response = cluster.http.patch(
        f"{DEPLOYMENTS}/{name}/scale",
        json={"spec": {"replicas": count}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert response.status_code == 200, response.text


def live_pods(cluster: Cluster) -> list[str]:
    items = cluster.http.get("/api/v1/namespaces/default/pods").json()["items"]
    return [p["metadata"]["name"] for p in items if not p["metadata"].get("deletionTimestamp")]


SPEC = {
    "selector": {"matchLabels": LABELS},
    "scaleTargetRef": {"kind": "Deployment", "name": "chat"},
    "idle": {"after": "1s"},
    "scaleToZeroAfter": "2s",
    "wake": {"coldStartTimeout": "30s"},
}


def test_asleep_then_zero_then_back(
    cluster: Cluster, operator: OperatorThread, replicaset: ReplicaSetStandIn
) -> None:
    cluster.http.post(
        DEPLOYMENTS, json=deployment("chat", replicas=2, labels=LABELS)
    ).raise_for_status()
    wait_for("two pods", lambda: len(live_pods(cluster)) == 2)
    # Each tier is held while the test looks at it, then let go: with both tiers' clocks
    # running from the model's creation, the Asleep phase lasts scaleToZeroAfter minus the
    # pods' start and sleep, no time at all on a loaded machine.
    cluster.create_model("chat", {**SPEC, "scaleToZeroAfter": "1h"})

    wait_for(
        "Asleep first",
        lambda: (s := cluster.status("chat")).get("phase") == "Asleep" and s.get("asleep") == 2,
    )
    assert replicas(cluster) == 2
    cluster.patch_model("chat", {"spec": {"scaleToZeroAfter": SPEC["scaleToZeroAfter"]}})
    zero = wait_for(
        "ScaledToZero", lambda: (s := cluster.status("chat")).get("phase") == "ScaledToZero" and s
    )
    assert zero["scaledFromReplicas"] == 2
    assert replicas(cluster) == 0
    wait_for("pods gone", lambda: live_pods(cluster) == [])
    wait_for("a ScaledToZero event", lambda: cluster.events("ScaledToZero"))

    # Back, it stays awake while looked at (idle.after 1s would put it to sleep again).
    cluster.patch_model("chat", {"spec": {"idle": {"after": "1h"}, "scaleToZeroAfter": "2h"}})
    cluster.request_wake("chat")
    wait_for("scaled back to 2", lambda: replicas(cluster) == 2)
    status = wait_for(
        "Awake again",
        lambda: (s := cluster.status("chat")).get("phase") == "Awake" and s["awake"] == 2 and s,
    )
    assert status.get("scaledFromReplicas") is None
    assert status["lastWakeSeconds"] > 0
    wait_for("a ScaledUp event", lambda: cluster.events("ScaledUp"))


def test_manual_scale_is_respected(
    cluster: Cluster, operator: OperatorThread, replicaset: ReplicaSetStandIn
) -> None:
    cluster.http.post(
        DEPLOYMENTS, json=deployment("chat", replicas=1, labels=LABELS)
    ).raise_for_status()
    cluster.create_model("chat", SPEC)
    wait_for("ScaledToZero", lambda: cluster.status("chat").get("phase") == "ScaledToZero")

    scale(cluster, 3)  # by hand, while Snooze holds it at zero
    wait_for("a ScaledByHand event", lambda: cluster.events("ScaledByHand"))
    wait_for("three pods", lambda: len(live_pods(cluster)) == 3)
    # The pods sleep (first tier), but the workload is not taken to zero again.
    wait_for("asleep", lambda: cluster.status("chat").get("asleep") == 3)
    # A sleep: proves the workload stays at three replicas for 3 s (past scaleToZeroAfter).
    time.sleep(3)
    assert replicas(cluster) == 3
    assert cluster.status("chat")["phase"] == "Asleep"


def test_min_awake_forbids_zero(
    cluster: Cluster, operator: OperatorThread, replicaset: ReplicaSetStandIn
) -> None:
    cluster.http.post(
        DEPLOYMENTS, json=deployment("chat", replicas=2, labels=LABELS)
    ).raise_for_status()
    cluster.create_model("chat", {**SPEC, "minAwake": 1})
    wait_for("one asleep", lambda: cluster.status("chat").get("asleep") == 1)
    # A sleep: proves minAwake keeps two replicas for 3 s (past scaleToZeroAfter).
    time.sleep(3)
    assert replicas(cluster) == 2


def test_desired_awake_scales_up(
    cluster: Cluster, operator: OperatorThread, replicaset: ReplicaSetStandIn
) -> None:
    cluster.http.post(
        DEPLOYMENTS, json=deployment("chat", replicas=1, labels=LABELS)
    ).raise_for_status()
    cluster.create_model("chat", SPEC)
    wait_for("ScaledToZero", lambda: cluster.status("chat").get("phase") == "ScaledToZero")
    cluster.patch_model("chat", {"spec": {"desiredState": "Awake"}})
    wait_for("Awake", lambda: cluster.status("chat").get("phase") == "Awake")
    assert replicas(cluster) == 1


def test_requests_through_the_gateway_at_each_tier(
    cluster: Cluster, operator: OperatorThread, gateway: GatewayThread
) -> None:
    """Awake: no wait. Asleep: a wake's wait. At zero: a cold start's wait, held all along."""
    stand_in = ReplicaSetStandIn(
        url=cluster.sandbox.url,
        sim=cluster.sim,
        addresses=_addresses,
        startup_seconds=1.0,  # the cold start: the engine listens only once "loaded"
        wake_seconds=0.1,
        model="chat",
    ).start()
    try:
        cluster.http.post(
            DEPLOYMENTS, json=deployment("chat", replicas=1, labels=LABELS)
        ).raise_for_status()
        cluster.create_model("chat", {**SPEC, "idle": {"after": "2s"}, "scaleToZeroAfter": "4s"})
        client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)

        def held() -> float:
            raw = client.chat.completions.with_raw_response.create(
                model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
            assert raw.parse().choices[0].message.content
            return float(raw.headers["x-snooze-held-seconds"])

        wait_for("Awake", lambda: cluster.status("chat").get("phase") == "Awake")
        wait_for("the gateway to know it", lambda: [m.id for m in client.models.list()] == ["chat"])
        awake = held()
        wait_for("Asleep", lambda: cluster.status("chat").get("phase") == "Asleep", timeout=20)
        asleep = held()
        wait_for(
            "ScaledToZero",
            lambda: cluster.status("chat").get("phase") == "ScaledToZero",
            timeout=30,
        )
        wait_for("no pods", lambda: live_pods(cluster) == [])
        zero = held()
        assert awake < 0.05
        assert 0.1 <= asleep < 1.0
        assert zero >= 1.0 and zero > asleep
        assert replicas(cluster) == 1
    finally:
        stand_in.stop()
