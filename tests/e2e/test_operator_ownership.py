"""The operator acts only on what a model owns: its name, its pods, its workload.

Each test plays a tenant that sets what a tenant can set (a modelName, a selector, a
scaleTargetRef) against another's, and asserts on what the engines and workloads saw.
"""

from __future__ import annotations

import time
from typing import Any

from waits import wait_for

from snooze.demo.controller import deployment

from .conftest import Cluster, OperatorThread


def condition(cluster: Cluster, name: str, kind: str) -> dict[str, Any]:
    found = cluster.condition(name, kind)
    return found or {}


def other_namespace(cluster: Cluster, name: str) -> Cluster:
    response = cluster.http.post(
        "/api/v1/namespaces",
        json={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
    )
    assert response.status_code == 201, response.text
    return Cluster(cluster.sandbox, cluster.sim, namespace=name)


def test_a_model_name_claimed_twice_stays_with_the_first(
    cluster: Cluster, operator: OperatorThread
) -> None:
    spec = {
        "modelName": "llama",
        "selector": {"matchLabels": {"app": "llama"}},
        "idle": {"after": "1h"},
    }
    cluster.create_pod("a-0", labels={"app": "llama"})
    cluster.create_model("first", spec)
    wait_for(
        "first holds it",
        lambda: condition(cluster, "first", "Conflict").get("reason") == "NameHeld",
    )

    tenant = other_namespace(cluster, "tenant-b")
    try:
        tenant.create_pod("b-0", labels={"app": "llama"})
        tenant.create_model("second", spec)
        taken = wait_for(
            "the second flagged",
            lambda: (c := condition(tenant, "second", "Conflict")).get("status") == "True" and c,
        )
        assert taken["reason"] == "ModelNameTaken"
        assert "Choose another spec.modelName" in taken["message"]
        assert "default" not in taken["message"]  # nothing of the other tenant is disclosed
        assert tenant.events("ModelNameTaken")
        # The first keeps it, however often the operator looks again.
        # A sleep: proves the first keeps the name for half a second (five probes).
        time.sleep(0.5)
        assert condition(cluster, "first", "Conflict")["status"] == "False"
        assert tenant.status("second")["modelName"] == "llama"

        # The holder gives the name up: the other one gets it.
        cluster.patch_model("first", {"spec": {"modelName": "llama-old"}})
        wait_for(
            "the second holds it",
            lambda: condition(tenant, "second", "Conflict").get("status") == "False",
        )
        assert tenant.events("ModelNameTakenResolved")
        assert condition(cluster, "first", "Conflict")["status"] == "False"
    finally:
        tenant.close()


def test_a_new_model_never_takes_a_held_name_even_if_older(
    cluster: Cluster, operator: OperatorThread
) -> None:
    cluster.create_pod("old-0", labels={"app": "old"})
    cluster.create_pod("new-0", labels={"app": "new"})
    # "old" is created first under another name, then renamed onto the name "new" holds.
    cluster.create_model("old", {"modelName": "other", "selector": {"matchLabels": {"app": "old"}}})
    cluster.create_model(
        "new", {"modelName": "shared", "selector": {"matchLabels": {"app": "new"}}}
    )
    wait_for(
        "new holds it", lambda: condition(cluster, "new", "Conflict").get("reason") == "NameHeld"
    )
    cluster.patch_model("old", {"spec": {"modelName": "shared"}})
    wait_for("old flagged", lambda: condition(cluster, "old", "Conflict").get("status") == "True")
    assert condition(cluster, "new", "Conflict")["status"] == "False"


def test_an_invalid_spec_claims_no_name(cluster: Cluster, operator: OperatorThread) -> None:
    cluster.create_pod("v-0", labels={"app": "v"})
    cluster.create_model("valid", {"modelName": "n", "selector": {"matchLabels": {"app": "v"}}})
    wait_for(
        "valid holds it",
        lambda: condition(cluster, "valid", "Conflict").get("reason") == "NameHeld",
    )
    # Valid for the CRD's schema, refused by the operator (a zero duration): invalid.
    cluster.create_model(
        "broken",
        {"modelName": "n", "selector": {"matchLabels": {"app": "v"}}, "idle": {"after": "0s"}},
    )
    wait_for("broken invalid", lambda: cluster.status("broken").get("phase") == "Invalid")
    assert cluster.status("broken")["modelName"] == ""
    assert condition(cluster, "valid", "Conflict")["status"] == "False"


def test_a_pod_selected_by_two_models_is_acted_on_by_neither(
    cluster: Cluster, operator: OperatorThread
) -> None:
    engine = cluster.create_pod("both-0", labels={"app": "x", "team": "y"})
    mine = cluster.create_pod("mine-0", labels={"app": "x"})
    cluster.create_model(
        "by-app", {"selector": {"matchLabels": {"app": "x"}}, "idle": {"after": "1s"}}
    )
    cluster.create_model(
        "by-team", {"selector": {"matchLabels": {"team": "y"}}, "idle": {"after": "1s"}}
    )
    for name in ("by-app", "by-team"):
        wait_for(
            f"{name} flagged",
            lambda n=name: condition(cluster, n, "SharedPods").get("status") == "True",
        )
    assert "both-0" in condition(cluster, "by-app", "SharedPods")["message"]
    # The pod only one model selects sleeps as usual; the shared one is left as it was.
    wait_for("the unshared pod asleep", lambda: mine.is_sleeping)
    # A sleep: proves the shared pod is neither slept nor woken for 1.5 s (past idle.after).
    time.sleep(1.5)
    assert (engine.sleep_calls, engine.wake_calls) == (0, 0)
    entry = next(p for p in cluster.status("by-app")["pods"] if p["name"] == "both-0")
    assert entry["state"] == "shared"
    assert cluster.events("PodsShared")

    # Make the selectors disjoint: the conflict clears and the pod is managed again.
    cluster.patch_model("by-team", {"spec": {"selector": {"matchLabels": {"team": "z"}}}})
    wait_for(
        "resolved", lambda: condition(cluster, "by-app", "SharedPods").get("status") == "False"
    )
    wait_for("now slept by its one owner", lambda: engine.is_sleeping)


def test_a_scale_target_the_model_does_not_own_is_refused(
    cluster: Cluster, operator: OperatorThread
) -> None:
    payments = deployment("payments-api", replicas=3, labels={"app": "payments"})
    response = cluster.http.post("/apis/apps/v1/namespaces/default/deployments", json=payments)
    assert response.status_code == 201, response.text
    engine = cluster.create_pod("chat-0", labels={"app": "chat"})
    cluster.create_model(
        "chat",
        {
            "selector": {"matchLabels": {"app": "chat"}},
            "scaleTargetRef": {"kind": "Deployment", "name": "payments-api"},
            "idle": {"after": "1s"},
            "scaleToZeroAfter": "2s",
        },
    )
    refused = wait_for(
        "SpecValid False",
        lambda: (c := condition(cluster, "chat", "SpecValid")).get("status") == "False" and c,
    )
    assert "spec.scaleTargetRef" in refused["message"]
    assert "payments-api" in refused["message"]
    time.sleep(3.0)  # longer than idle.after and scaleToZeroAfter
    deployed = cluster.http.get("/apis/apps/v1/namespaces/default/deployments/payments-api").json()
    assert deployed["spec"]["replicas"] == 3
    assert engine.sleep_calls == 0
