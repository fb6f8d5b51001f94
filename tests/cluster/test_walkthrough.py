"""The walkthrough on a real cluster: simulated engines from examples/simulated/chat.yaml run
as a Deployment's pods; the idle model sleeps, a request through the gateway wakes it, and the
Events and status say so, as the sandbox walkthrough (docs/getting-started.md) does."""

from __future__ import annotations

import json
import os
from typing import Any

from controlplane import ROOT
from kube import Kube, wait_for

from .conftest import ENGINES, image

EXAMPLE = ROOT / "examples" / "simulated" / "chat.yaml"
ASK = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}


def apply_example(kube: Kube) -> None:
    """The example's own command, `kubectl apply -n llm -f examples/simulated/chat.yaml`, and,
    on an existing cluster, the image the tests were given."""
    command = next(
        line.strip("# ").split()
        for line in EXAMPLE.read_text().splitlines()
        if line.strip("# ").startswith("kubectl apply")
    )
    assert command == ["kubectl", "apply", "-n", ENGINES, "-f", "examples/simulated/chat.yaml"]
    if not os.environ.get("SNOOZE_TEST_IMAGE"):
        kube.kubectl(*command[1:-1], str(EXAMPLE))
        return
    # The image your cluster pulls, set before the pods start (a change after would roll out
    # new pods under the test's feet).
    repository, tag = image()
    text = EXAMPLE.read_text().replace("snooze:0.1.0", f"{repository}:{tag}")
    kube.kubectl(*command[1:-2], "-f", "-", input=text)


def engine_states(kube: Kube) -> dict[str, str]:
    return {
        pod.metadata.name: (pod.metadata.labels or {}).get("snooze.dev/state", "")
        for pod in kube.ready_pods(ENGINES, "app.kubernetes.io/name=chat")
    }


def sleeping(kube: Kube, pod: Any) -> bool:
    with kube.http() as http:
        return bool(http.get(kube.url(pod, 8000, "/is_sleeping")).json()["is_sleeping"])


def phase(kube: Kube) -> str:
    return str(kube.get("im", "chat", ENGINES).get("status", {}).get("phase", ""))


def test_an_idle_model_sleeps_and_a_request_wakes_it(kube: Kube, gateway_pod: Any) -> None:
    apply_example(kube)
    try:
        kube.kubectl(
            "wait", "-n", ENGINES, "im/chat", "--for=jsonpath={.status.phase}=Awake",
            "--timeout=120s",
        )  # fmt: skip
        pods = wait_for("two ready engines", lambda: len(kube.ready_pods(ENGINES,
                        "app.kubernetes.io/name=chat")) == 2 and kube.ready_pods(ENGINES,
                        "app.kubernetes.io/name=chat"))  # fmt: skip
        url = kube.url(gateway_pod, 8080, "/v1/chat/completions")
        with kube.http(timeout=120) as http:
            first = http.post(url, json=ASK)
            assert first.status_code == 200, first.text
            assert first.json()["choices"][0]["message"]["content"]

            # 15 idle seconds (the example's idle.after), then drain and a 5.7 s first sleep.
            wait_for("the model to sleep", lambda: phase(kube) == "Asleep", timeout=120)
            assert engine_states(kube) == {p.metadata.name: "asleep" for p in pods}
            assert all(sleeping(kube, pod) for pod in pods), "the engines say they are awake"

            held = http.post(url, json=ASK)
            assert held.status_code == 200, held.text
            assert float(held.headers["x-snooze-held-seconds"]) > 0
        wait_for("both engines awake", lambda: set(engine_states(kube).values()) == {"awake"})
        assert not any(sleeping(kube, pod) for pod in pods)

        events = json.loads(
            kube.kubectl("events", "-n", ENGINES, "--for", "im/chat", "-o", "json").stdout
        )["items"]
        reasons = [event["reason"] for event in events]
        for reason in ("Draining", "Slept", "Waking", "Woke"):
            assert reasons.count(reason) >= 2, reasons  # one for each engine
        status = kube.get("im", "chat", ENGINES)["status"]
        assert status["observedGeneration"] == 1
        conditions = {c["type"]: c["status"] for c in status["conditions"]}
        assert conditions["Ready"] == "True" and conditions["Asleep"] == "False"
        assert status["lastWakeSeconds"] > 0
    finally:
        kube.delete_and_wait(ENGINES, "app.kubernetes.io/name=chat", "-f", str(EXAMPLE))
