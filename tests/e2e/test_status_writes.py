"""A model's status is written once when its engines are first labelled, saying what they
are: not once with an "unknown" engine and again once the label is on (at 10,000 models,
10,000 API writes and as many watch events for nothing)."""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx
from waits import wait_for

from snooze.operator.embedded import OperatorThread

from .conftest import Cluster

LABELS = {"app": "chat"}


def test_no_status_says_an_engine_is_unknown_while_its_label_is_written(
    cluster: Cluster, operator: OperatorThread
) -> None:
    statuses: list[dict[str, Any]] = []
    stop = threading.Event()

    def watch() -> None:
        url = "/apis/snooze.dev/v1alpha1/namespaces/default/inferencemodels"
        with (
            httpx.Client(base_url=cluster.sandbox.url, timeout=None) as http,
            http.stream("GET", url, params={"watch": "1"}) as response,
        ):
            for line in response.iter_lines():
                if stop.is_set():
                    return
                status = json.loads(line)["object"].get("status")
                if status and (not statuses or status != statuses[-1]):
                    statuses.append(status)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    cluster.create_pod("chat-0", labels=LABELS)
    cluster.create_model("chat", {"selector": {"matchLabels": LABELS}, "idle": {"after": "1h"}})
    wait_for("phase Awake", lambda: cluster.status("chat").get("phase") == "Awake")

    def pod_states(status: dict[str, Any]) -> list[str]:
        return [p["state"] for p in status.get("pods") or []]

    # The watch may lag the API: wait until it has seen the status that says awake (it may
    # have seen an earlier one that says there is no pod yet first).
    wait_for(
        "the watch to see the engine awake",
        lambda: statuses[-1:] and pod_states(statuses[-1]) == ["awake"],
    )
    stop.set()
    # (A first status may say there is no pod yet, if the model's loop ran before the pod
    # reached the operator's index; never that its engine is unknown.)
    assert ["unknown"] not in [pod_states(s) for s in statuses], statuses
