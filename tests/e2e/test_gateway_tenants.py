"""Two tenants, one model name: the gateway routes a name only to the model that holds it.

The operator decides who holds a model name (the first to claim it) and says so on each
model's status: `status.modelName`, and a `Conflict` condition on the model that lost. The
first test runs the real operator; the others play it (stand_in.py writes the status
through the sandbox API exactly as the operator would), to reach the states in between
(a clash the operator has not settled yet, a name no status claims yet) at will. All
assert on what each tenant's engine saw.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from gateway_fixtures import GatewayThread, gateway, start_gateway
from stand_in import conflict, no_conflict, set_label, write_status
from waits import wait_for

from snooze.sandbox import Sandbox
from snooze.sim import SimulatedEngine, SimulatorHost

from .conftest import Cluster, OperatorThread
from .test_gateway import MESSAGES, engine_config

__all__ = ["gateway"]
NAME = "shared-llm"
CHAT = "POST /v1/chat/completions"
SECRET = "Bearer sk-victim-secret"


@pytest.fixture
def victim(sandbox: Sandbox, sim: SimulatorHost) -> Any:
    # The hijacker's namespace sorts first: a gateway that picks "the first" picks it.
    tenant = Cluster(sandbox, sim, namespace="team-victim")
    yield tenant
    tenant.close()


@pytest.fixture
def hijacker(sandbox: Sandbox, sim: SimulatorHost) -> Any:
    tenant = Cluster(sandbox, sim, namespace="aaa-hijack")
    yield tenant
    tenant.close()


def serve(tenant: Cluster, model: str, *, claim: bool = True) -> SimulatedEngine:
    """A model named NAME with one awake pod; its status claims NAME when `claim`."""
    engine = tenant.create_pod(
        f"{model}-0",
        labels={"app": model, "snooze.dev/state": "awake"},
        engine=engine_config(NAME),
    )
    tenant.create_model(model, {"modelName": NAME, "selector": {"matchLabels": {"app": model}}})
    if claim:
        write_status(tenant, model, model_name=NAME, pods={f"{model}-0": "awake"})
    return engine


def ask(gw: GatewayThread, **headers: str) -> httpx.Response:
    return httpx.post(
        gw.url + "/v1/chat/completions",
        json={"model": NAME, "messages": MESSAGES, "max_tokens": 2},
        headers={"Authorization": SECRET, **headers},
        timeout=10,
    )


def listed(gw: GatewayThread) -> list[str]:
    return [m["id"] for m in httpx.get(gw.url + "/v1/models").json()["data"]]


def test_a_second_tenant_claiming_a_name_gets_none_of_its_traffic(
    victim: Cluster, hijacker: Cluster, operator: OperatorThread, gateway: GatewayThread
) -> None:
    spec = {
        "modelName": NAME,
        "selector": {"matchLabels": {"app": "chat"}},
        "idle": {"after": "1h"},
    }
    labels = {"app": "chat"}
    theirs = victim.create_pod("chat-0", labels=labels, engine=engine_config(NAME))
    victim.create_model("chat", spec)
    wait_for("the victim served", lambda: ask(gateway).status_code == 200)

    mine = hijacker.create_pod("chat-0", labels=labels, engine=engine_config(NAME))
    hijacker.create_model("chat", spec)
    # Asked while the operator sees the newcomer, and after: every answer is the victim's.
    codes = [ask(gateway).status_code for _ in range(5)]
    wait_for(
        "the newcomer flagged",
        lambda: (hijacker.condition("chat", "Conflict") or {}).get("status") == "True",
    )
    wait_for("its pod awake", lambda: hijacker.pod_state("chat-0") == "awake")
    codes += [ask(gateway).status_code for _ in range(5)]
    assert codes == [200] * 10
    assert theirs.seen[CHAT] == 11
    assert mine.seen[CHAT] == 0 and mine.requests_served == 0
    assert listed(gateway) == [NAME]


def test_a_name_claimed_twice_is_never_routed_and_the_holder_gets_its_own_traffic(
    victim: Cluster, hijacker: Cluster, gateway: GatewayThread
) -> None:
    theirs = serve(victim, "chat")
    wait_for("the victim served", lambda: ask(gateway).status_code == 200)
    assert theirs.seen[CHAT] == 1

    # A second tenant claims the same name; the operator has not settled it yet.
    mine = serve(hijacker, "chat")
    answer = wait_for("the clash seen", lambda: (r := ask(gateway)).status_code == 503 and r)
    error = answer.json()["error"]
    assert error["code"] == "model_name_conflict"
    assert "2 models" in error["message"]
    assert "kubectl get inferencemodels.snooze.dev -A" in error["message"]
    assert "team-victim" not in answer.text and "aaa-hijack" not in answer.text
    assert int(answer.headers["Retry-After"]) >= 1
    assert listed(gateway).count(NAME) == 1

    # The operator settles it: the first claimant holds the name, the other has Conflict.
    write_status(
        hijacker, "chat", model_name=NAME, pods={"chat-0": "awake"}, conditions=[conflict("x")]
    )
    write_status(
        victim, "chat", model_name=NAME, pods={"chat-0": "awake"}, conditions=[no_conflict()]
    )
    wait_for("routed again", lambda: ask(gateway).status_code == 200)
    for _ in range(6):
        assert ask(gateway).status_code == 200
    assert theirs.seen[CHAT] == 8
    # The prompt and the Authorization header never reached the other tenant's engine.
    assert mine.seen[CHAT] == 0 and mine.requests_served == 0
    assert listed(gateway).count(NAME) == 1


def test_a_name_in_a_spec_that_no_status_claims_yet_is_not_routed(
    victim: Cluster, hijacker: Cluster, gateway: GatewayThread
) -> None:
    theirs = serve(victim, "chat", claim=False)
    answer = wait_for("the model seen", lambda: (r := ask(gateway)).status_code != 404 and r)
    assert answer.status_code == 503
    assert "not yet served by the operator" in answer.json()["error"]["message"]
    assert int(answer.headers["Retry-After"]) >= 1
    assert theirs.seen[CHAT] == 0

    # Once a status claims it, it is served; a newcomer's spec alone changes nothing.
    write_status(victim, "chat", model_name=NAME, pods={"chat-0": "awake"})
    wait_for("served", lambda: ask(gateway).status_code == 200)
    mine = serve(hijacker, "chat", claim=False)
    for _ in range(4):
        assert ask(gateway).status_code == 200
    assert mine.seen[CHAT] == 0
    assert theirs.seen[CHAT] == 5
    assert listed(gateway) == [NAME]


def test_a_pod_labelled_awake_by_its_owner_is_not_routed_until_the_status_says_so(
    cluster: Cluster, gateway: GatewayThread
) -> None:
    """No operator runs: the label alone must not be enough, nor a status entry of another
    pod that had the same name (a pod recreated under the old name has a new uid)."""
    cluster.create_pod("m-0", labels={"app": "m", "snooze.dev/state": "awake"})
    fooled = cluster.create_pod("m-1", labels={"app": "m", "snooze.dev/state": "asleep"})
    cluster.create_model(
        "m", {"selector": {"matchLabels": {"app": "m"}}, "wake": {"timeout": "1s"}}
    )
    write_status(cluster, "m", model_name="m", pods={"m-0": "awake", "m-1": "asleep"})
    body = {"model": "m", "prompt": "hello", "max_tokens": 2}
    wait_for("served", lambda: httpx.post(gateway.url + "/v1/completions", json=body).is_success)

    set_label(cluster, "m-1", "awake")  # the pod's owner, not the operator
    wait_for("the gateway sees the label", lambda: label_seen(gateway, "m-1") == "awake")
    for _ in range(6):
        assert httpx.post(gateway.url + "/v1/completions", json=body).status_code == 200
    assert fooled.seen["POST /v1/completions"] == 0

    # The pod is recreated under the same name, labelled awake by its owner: the status entry
    # (with the old pod's uid) does not vouch for it.
    cluster.delete_pod("m-0")
    wait_for("m-0 gone", lambda: label_seen(gateway, "m-0") is None)
    impostor = cluster.create_pod("m-0", labels={"app": "m", "snooze.dev/state": "awake"})
    set_label(cluster, "m-1", "asleep")
    wait_for("the gateway sees the new pod", lambda: label_seen(gateway, "m-0") == "awake")
    answer = httpx.post(gateway.url + "/v1/completions", json=body, timeout=10)
    assert answer.status_code == 504  # held for a wake no operator performs
    assert impostor.seen["POST /v1/completions"] == 0
    assert fooled.seen["POST /v1/completions"] == 0


def test_anonymous_clients_see_model_names_only_unless_status_is_exposed(
    victim: Cluster, cluster: Cluster
) -> None:
    serve(victim, "chat")
    for expose in (False, True):
        gw = start_gateway(expose_model_status=expose)
        try:
            wait_for("listed", lambda gw=gw: listed(gw) == [NAME])
            listing = httpx.get(gw.url + "/v1/models")
            one = httpx.get(f"{gw.url}/v1/models/{NAME}").json()
            assert ("snooze" in one) is expose
            assert ("team-victim" in listing.text) is expose
            if not expose:
                assert listing.json()["data"] == [
                    {"id": NAME, "object": "model", "created": 0, "owned_by": "snooze"}
                ]
        finally:
            gw.stop()


def label_seen(gw: GatewayThread, pod: str) -> str | None:
    def read() -> str | None:
        info = gw.g.registry.pods.get(("default", pod))
        return None if info is None else info.labels.get("snooze.dev/state")

    return gw.call(read)
