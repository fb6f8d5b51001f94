"""The operator's hostile scenes (hostile.py --scene): engines that contradict themselves.

`loops`: beside one calm model (a `snooze sim` engine, woken and left to sleep round after
round, as in hostile.py's phases), a model of two hostile engines in a namespace of its own,
one phase each: engines whose `/metrics` says asleep while `/is_sleeping` says awake, asked
to wake every ASK_EVERY seconds as a gateway asks for the requests it holds
(`contradicts`); engines whose sleep-state gauge flips at each scrape (`flips`); and the
first ones again under one wake request, which their first wake answers (`stale`: the
annotation stays, and the engines soon say asleep again). The operator runs as a process of
its own; the sandbox counts every write it answers, by namespace and resource. Each phase
reports the hostile namespace's writes a minute (pod patches, status patches, Events), the
calls the hostile engines got a minute, the operator's CPU and the calm model's wake, beside
the control (the same rounds with no hostile model).
"""

from __future__ import annotations

import collections
import contextlib
import statistics
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
from harness import Bench, WriteCounter, free_port, wait_until
from hostile import Hostiles, cpu_seconds, rounds_of

from snooze.api.times import format_time

HOSTILE_NS = "hostile"
MERGE = {"Content-Type": "application/merge-patch+json"}
ENGINES = 2
ASK_EVERY = 5.0


def per_minute(counts: collections.Counter[str], seconds: float) -> dict[str, float]:
    minutes = seconds / 60.0
    found = {k: round(v / minutes, 1) for k, v in sorted(counts.items())}
    found["total"] = round(sum(counts.values()) / minutes, 1)
    return found


@contextlib.contextmanager
def hostile_model(
    setup: Bench, hostiles: Hostiles, name: str, kind: str, *, wake_requested: bool
) -> Iterator[list[str]]:
    """A model of ENGINES hostile engines of `kind` in HOSTILE_NS (and, with `wake_requested`,
    a wake request stamped as it is created, as a gateway holding a request would)."""
    api = setup.api
    pods = f"/api/v1/namespaces/{HOSTILE_NS}/pods"
    models = f"/apis/snooze.dev/v1alpha1/namespaces/{HOSTILE_NS}/inferencemodels"
    hosts = [str(hostiles.address()) for _ in range(ENGINES)]
    labels = {"app": name}
    for i, host in enumerate(hosts):
        httpx.post(hostiles.control, json={"host": host, "kind": kind}).raise_for_status()
        api.post(pods, json={"metadata": {"name": f"{name}-{i}", "labels": labels}})
        ready = {
            "phase": "Running",
            "podIP": host,
            "conditions": [{"type": "Ready", "status": "True"}],
        }
        api.patch(f"{pods}/{name}-{i}/status", json={"status": ready}, headers=MERGE)
    metadata: dict[str, Any] = {"name": name}
    if wake_requested:
        metadata["annotations"] = {"snooze.dev/wake-requested-at": format_time(time.time())}
    body = {
        "apiVersion": "snooze.dev/v1alpha1",
        "kind": "InferenceModel",
        "metadata": metadata,
        "spec": {"selector": {"matchLabels": labels}, "idle": {"after": "1m"}},
    }
    api.post(models, json=body).raise_for_status()
    try:
        yield hosts
    finally:
        api.delete(f"{models}/{name}")
        for i in range(ENGINES):
            api.delete(f"{pods}/{name}-{i}")


@contextlib.contextmanager
def asking(setup: Bench, name: str, every: float | None) -> Iterator[None]:
    """A wake request for the hostile model every `every` seconds, meanwhile (None: none)."""
    stop = threading.Event()
    path = f"/apis/snooze.dev/v1alpha1/namespaces/{HOSTILE_NS}/inferencemodels/{name}"

    def ask() -> None:
        with httpx.Client(base_url=setup.sandbox.url, timeout=10) as api:
            while not stop.wait(every or 0):
                stamp = format_time(time.time())
                patch = {"metadata": {"annotations": {"snooze.dev/wake-requested-at": stamp}}}
                api.patch(path, json=patch, headers=MERGE)

    thread = threading.Thread(target=ask, daemon=True)
    if every is not None:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        if every is not None:
            thread.join()


def engine_calls(hostiles: Hostiles, hosts: list[str]) -> collections.Counter[str]:
    report = httpx.get(hostiles.control).json()
    calls: collections.Counter[str] = collections.Counter()
    for host in hosts:
        calls.update(report[host]["requests"])
    return calls


def phase(
    setup: Bench, counter: WriteCounter, pid: int, rounds: int, **hostile: Any
) -> dict[str, Any]:
    """The calm model's rounds, with the hostile model of `hostile` (none: the control)."""
    hostiles: Hostiles | None = hostile.pop("hostiles", None)
    every: float | None = hostile.pop("asks_every", None)
    with contextlib.ExitStack() as stack:
        hosts: list[str] = []
        if hostiles is not None:
            hosts = stack.enter_context(hostile_model(setup, hostiles, **hostile))
            # Settled in: the operator has seen the model and its engines.
            wait_until("the hostile model's status", lambda: hostile_status(setup, hostile["name"]))
            stack.enter_context(asking(setup, hostile["name"], every))
        writes_before = counter.count(HOSTILE_NS)
        calm_before = counter.count("default")
        calls_before = engine_calls(hostiles, hosts) if hostiles else collections.Counter()
        cpu, began = cpu_seconds(pid), time.monotonic()
        wakes, _ = rounds_of(setup, rounds)
        seconds = time.monotonic() - began
        result: dict[str, Any] = {
            "seconds": round(seconds, 1),
            "calm_wake_s_p50": round(statistics.median(wakes), 3),
            "cpu_s_per_s": round((cpu_seconds(pid) - cpu) / seconds, 3),
            "calm_writes_per_min": per_minute(counter.count("default") - calm_before, seconds),
            "hostile_writes_per_min": per_minute(
                counter.count(HOSTILE_NS) - writes_before, seconds
            ),
        }
        if hostiles is not None:
            calls = engine_calls(hostiles, hosts) - calls_before
            result["hostile_engine_calls_per_min"] = per_minute(calls, seconds)
            result["hostile_status"] = hostile_status(setup, hostile["name"])
        return result


def hostile_status(setup: Bench, name: str) -> dict[str, Any] | None:
    path = f"/apis/snooze.dev/v1alpha1/namespaces/{HOSTILE_NS}/inferencemodels/{name}"
    status = setup.api.get(path).json().get("status") or {}
    pods = status.get("pods") or []
    if not pods:
        return None
    return {p["name"]: p.get("state") for p in pods}


def loops(setup: Bench, counter: WriteCounter, rounds: int, interval: float) -> dict[str, Any]:
    setup.engine(model="calm", token_seconds=0.002, wake_seconds=0.3)
    setup.pod_and_model("calm", state=None, spec={"idle": {"after": "2s"}})
    hostiles = Hostiles(setup)
    metrics_port = free_port()
    setup.spawn("-m", "snooze.cli", "operator", "--probe-interval", str(interval),
                "--metrics-port", str(metrics_port))  # fmt: skip
    pid = setup.procs[-1].pid
    report: dict[str, Any] = {"scene": "loops", "rounds": rounds, "probe_interval": interval}
    report["control"] = control = phase(setup, counter, pid, rounds)
    scenes = {
        "contradicts": {"kind": "contradicts", "wake_requested": True, "asks_every": ASK_EVERY},
        "flips": {"kind": "flips", "wake_requested": False},
        "stale": {"kind": "contradicts", "wake_requested": True},
    }
    for name, hostile in scenes.items():
        result = phase(setup, counter, pid, rounds, hostiles=hostiles, name=name, **hostile)
        result["ratio_to_control"] = {
            "calm_wake_s_p50": round(result["calm_wake_s_p50"] / control["calm_wake_s_p50"], 2),
            "cpu_s_per_s": round(result["cpu_s_per_s"] / max(control["cpu_s_per_s"], 1e-3), 2),
        }
        result["hostile_writes_per_pod_per_min"] = round(
            result["hostile_writes_per_min"]["total"] / ENGINES, 1
        )
        report[name] = result
    return report
