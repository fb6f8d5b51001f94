"""An SGLang model on a real cluster: a Deployment's pod of simulated SGLang
(examples/simulated/qa-sglang.yaml) released when idle and resumed for a request through the
gateway, its state kept on the pod through the real API server; then its workload scaled to
zero, and a request brings a fresh server up."""

from __future__ import annotations

import copy
import json
from typing import Any

import yaml
from controlplane import ROOT
from kube import Kube, wait_for

from .conftest import ENGINES
from .test_walkthrough import image

EXAMPLE = ROOT / "examples" / "simulated" / "qa-sglang.yaml"
LABEL = "app.kubernetes.io/name=qa"
ASK = {"model": "qa", "messages": [{"role": "user", "content": "hi"}]}
RELEASED = "snooze.dev/released"


def manifests() -> list[dict[str, Any]]:
    """The example, with the tests' image."""
    deployment, model = (copy.deepcopy(d) for d in yaml.safe_load_all(EXAMPLE.read_text()))
    repository, tag = image()
    deployment["spec"]["template"]["spec"]["containers"][0]["image"] = f"{repository}:{tag}"
    return [deployment, model]


def phase(kube: Kube) -> str:
    return str(kube.get("im", "qa", ENGINES).get("status", {}).get("phase", ""))


def report(kube: Kube) -> str:
    """The model's status and the tails of the operator's and the server's logs, for a
    failure's message."""
    lines = [json.dumps(kube.get("im", "qa", ENGINES).get("status", {}), indent=1)]
    workdir = getattr(kube.local, "workdir", None)
    if workdir is not None:
        for log in sorted((workdir / "pods").glob("*/*.log")):
            if "operator" in log.parent.name or "qa-" in log.parent.name:
                tail = log.read_text(errors="replace").splitlines()[-40:]
                lines += [f"--- {log.parent.name}/{log.name}", *tail]
    return "\n".join(lines)


def asleep(kube: Kube) -> bool:
    return phase(kube) == "Asleep"


def released(pod: Any) -> str | None:
    value = (pod.metadata.annotations or {}).get(RELEASED)
    return None if value is None else str(value)


def test_an_sglang_model_sleeps_wakes_and_scales_to_zero(kube: Kube, gateway_pod: Any) -> None:
    assert yaml.safe_load_all(EXAMPLE.read_text())  # the example as users apply it
    kube.apply(manifests(), "-n", ENGINES)
    try:
        kube.kubectl(
            "wait", "-n", ENGINES, "im/qa", "--for=jsonpath={.status.phase}=Awake",
            "--timeout=120s",
        )  # fmt: skip
        [pod] = wait_for("a ready server", lambda: kube.ready_pods(ENGINES, LABEL))
        url = kube.url(gateway_pod, 8080, "/v1/chat/completions")
        with kube.http(timeout=120) as http:
            assert http.post(url, json=ASK).status_code == 200
            # 15 idle seconds, the greedy answers and the weights' digests recorded, then
            # paused and released: the pod says what, through the API server.
            try:
                wait_for("the model asleep", lambda: asleep(kube), timeout=150)
            except AssertionError as error:
                raise AssertionError(f"{error}\n{report(kube)}") from None
            [pod] = kube.ready_pods(ENGINES, LABEL)
            assert released(pod) == "0:cuda_graph,kv_cache,paused,weights"
            # The server itself: paused (/ready 503 from 0.5.20), and its metrics say so.
            assert http.get(kube.url(pod, 8000, "/ready")).status_code == 503
            held = http.post(url, json=ASK)
            assert held.status_code == 200, held.text
            assert float(held.headers["x-snooze-held-seconds"]) > 0
            assert "garbage" not in held.text  # the weights were reloaded
            wait_for("the model awake", lambda: phase(kube) == "Awake")
            [pod] = kube.ready_pods(ENGINES, LABEL)
            assert released(pod) is None
            assert http.get(kube.url(pod, 8000, "/ready")).status_code == 200
        events = json.loads(
            kube.kubectl("events", "-n", ENGINES, "--for", "im/qa", "-o", "json").stdout
        )["items"]
        reasons = [event["reason"] for event in events]
        for reason in ("Draining", "Slept", "Waking", "Woke"):
            assert reason in reasons, reasons

        # Asleep again, then its workload at zero replicas (75 s after its last request); a
        # request brings a new pod (a fresh server, nothing released on it) and is answered.
        wait_for("zero replicas", lambda: phase(kube) == "ScaledToZero", timeout=180)
        with kube.http(timeout=180) as http:
            cold = http.post(url, json=ASK)
            assert cold.status_code == 200, cold.text
        [fresh] = wait_for("a new server", lambda: kube.ready_pods(ENGINES, LABEL))
        assert fresh.metadata.name != pod.metadata.name and released(fresh) is None
    finally:
        kube.delete_and_wait(ENGINES, LABEL, "-f", str(EXAMPLE))
