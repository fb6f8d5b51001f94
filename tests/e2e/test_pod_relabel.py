"""A pod relabelled out of a model's selector (or into it) is seen at once, not at the model's
next probe interval: the pod's change pokes the models that select it now or did before."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace

import pytest
from waits import wait_for

from snooze.operator.embedded import OperatorThread

from .conftest import FAST, Cluster

# Cycles 30 s apart: only a poke makes the loop look sooner.
SLOW = replace(FAST, probe_interval=30.0, drift_interval=60.0)


@pytest.fixture
def slow_operator(cluster: Cluster) -> Iterator[OperatorThread]:
    thread = OperatorThread(SLOW).start()
    yield thread
    thread.stop()


def pods_on_status(cluster: Cluster) -> list[str]:
    return [p["name"] for p in cluster.status("chat").get("pods") or []]


def test_a_pod_relabelled_out_of_the_selector_leaves_the_model_at_once(
    cluster: Cluster, slow_operator: OperatorThread
) -> None:
    cluster.create_pod("chat-0", labels={"app": "chat"})
    cluster.create_pod("chat-1", labels={"app": "chat"})
    cluster.create_model("chat", {"selector": {"matchLabels": {"app": "chat"}}})
    wait_for("both pods on the status", lambda: pods_on_status(cluster) == ["chat-0", "chat-1"])
    wait_for(
        "both labelled", lambda: {cluster.pod_state(p) for p in ("chat-0", "chat-1")} == {"awake"}
    )
    time.sleep(2)  # the cycles that follow the labels are over: the next is 30 s away
    response = cluster.http.patch(
        "/api/v1/namespaces/default/pods/chat-1",
        json={"metadata": {"labels": {"app": "batch"}}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert response.status_code == 200, response.text
    # Well within the 30 s between cycles.
    wait_for("chat-1 gone from the status", lambda: pods_on_status(cluster) == ["chat-0"], 5)
