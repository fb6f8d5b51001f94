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

import argparse
import collections
import contextlib
import statistics
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
from harness import Bench, WriteCounter, free_port, loopback, wait_until
from hostile import Hostiles, cpu_seconds, rounds_of

from snooze.api.times import format_time

HOSTILE_NS = "hostile"
MERGE = {"Content-Type": "application/merge-patch+json"}
ENGINES = 2
ASK_EVERY = 5.0
HOSTILE_IDLE = "10s"
PHASE_SECONDS = 120.0
"""Each hostile phase lasts this long at least: a brake's holds grow over a minute or two."""


def per_minute(counts: collections.Counter[str], seconds: float) -> dict[str, float]:
    minutes = seconds / 60.0
    found = {k: round(v / minutes, 1) for k, v in sorted(counts.items())}
    found["total"] = round(sum(counts.values()) / minutes, 1)
    return found


@contextlib.contextmanager
def hostile_model(
    hostiles: Hostiles, name: str, kind: str, *, wake_requested: bool
) -> Iterator[list[str]]:
    """A model of ENGINES hostile engines of `kind` in HOSTILE_NS (and, with `wake_requested`,
    a wake request stamped as it is created, as a gateway holding a request would)."""
    stamp = {"snooze.dev/wake-requested-at": format_time(time.time())} if wake_requested else {}
    spec = {"idle": {"after": HOSTILE_IDLE}}
    hosts = hostiles.add(
        name, ENGINES, namespace=HOSTILE_NS, annotations=stamp, spec=spec, kind=kind
    )
    try:
        yield hosts
    finally:
        hostiles.remove(name, ENGINES, namespace=HOSTILE_NS)


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
            hosts = stack.enter_context(hostile_model(hostiles, **hostile))
            # Settled in: the operator has seen the model and its engines.
            wait_until("the hostile model's status", lambda: hostile_status(setup, hostile["name"]))
            stack.enter_context(asking(setup, hostile["name"], every))
        writes_before = counter.count(HOSTILE_NS)
        calm_before = counter.count("default")
        calls_before = engine_calls(hostiles, hosts) if hostiles else collections.Counter()
        cpu, began = cpu_seconds(pid), time.monotonic()
        wakes, _ = rounds_of(setup, rounds)
        if hostiles is not None:
            wait_until("the phase's end", lambda: time.monotonic() - began >= PHASE_SECONDS, 300)
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


def loops(setup: Bench, counter: WriteCounter, args: argparse.Namespace) -> dict[str, Any]:
    rounds, interval = args.rounds, args.probe_interval
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


# -- tenants: one tenant's churn against another's wakes ---------------------------------------

FLAP_NS = "flap"
# The tightest keep-awake windows allowed: together, a start every ten minutes.
WINDOWS = [
    {"name": "even", "cron": "*/20 * * * *", "duration": "2m"},
    {"name": "odd", "cron": "10-59/20 * * * *", "duration": "2m"},
]
FLAP_ASK_EVERY = 2.0
"""Each flapping model is asked to wake this often (its client sends a request, its engine
falls idle after a second and is put to sleep, and the next request wakes it again)."""
BUDGET_PER_MODEL = 12.0  # a minute: the operator's default --write-budget (2 per 10 s)
BURST_PER_MODEL = 60.0
MEASURED_SECONDS = 60.0


def flapping_tenant(hostiles: Hostiles, count: int) -> list[str]:
    """`count` models in FLAP_NS, an engine each that is busy and idle by turns."""
    names = [f"flap-{i:03d}" for i in range(count)]
    spec = {"idle": {"after": "1s"}, "schedule": WINDOWS}
    for name in names:
        hostiles.add(name, 1, namespace=FLAP_NS, spec=spec, kind="flaps")
    return names


@contextlib.contextmanager
def churning(setup: Bench, names: list[str], asked: list[int]) -> Iterator[None]:
    """A wake request for each flapping model every FLAP_ASK_EVERY seconds, meanwhile (each
    counted in `asked[0]`: the benchmark's own writes, not the operator's)."""
    stop = threading.Event()
    models = f"/apis/snooze.dev/v1alpha1/namespaces/{FLAP_NS}/inferencemodels"

    def ask() -> None:
        with httpx.Client(base_url=setup.sandbox.url, timeout=10) as api:
            while not stop.is_set():
                began = time.monotonic()
                for name in names:
                    stamp = format_time(time.time())
                    patch = {"metadata": {"annotations": {"snooze.dev/wake-requested-at": stamp}}}
                    api.patch(f"{models}/{name}", json=patch, headers=MERGE)
                    asked[0] += 1
                    if stop.is_set():
                        return
                stop.wait(max(0.0, FLAP_ASK_EVERY - (time.monotonic() - began)))

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


QUIET = 9
"""Models of the calm tenant that nothing asks for (they select no pod): its budget is ten
models', and its one woken round after round stays within it."""


def quiet_models(setup: Bench) -> None:
    models = "/apis/snooze.dev/v1alpha1/namespaces/default/inferencemodels"
    for i in range(QUIET):
        spec = {"selector": {"matchLabels": {"app": f"quiet-{i}"}}}
        body = {"apiVersion": "snooze.dev/v1alpha1", "kind": "InferenceModel"}
        body |= {"metadata": {"name": f"quiet-{i}"}, "spec": spec}
        setup.api.post(models, json=body).raise_for_status()


def labelled(setup: Bench, names: list[str]) -> int:
    pods = setup.api.get(f"/api/v1/namespaces/{FLAP_NS}/pods").json().get("items") or []
    return sum(1 for p in pods if (p["metadata"].get("labels") or {}).get("snooze.dev/state"))


def calm_phase(
    setup: Bench, counter: WriteCounter, pid: int, rounds: int, asked: list[int]
) -> dict[str, Any]:
    """The calm tenant's wakes, and every namespace's writes meanwhile (over a minute at
    least), the flapping tenant's without the wake requests the benchmark wrote."""
    before = {ns: counter.count(ns) for ns in ("default", FLAP_NS)}
    asked_before = asked[0]
    cpu, began = cpu_seconds(pid), time.monotonic()
    wakes, lates = rounds_of(setup, rounds)
    wait_until("a minute", lambda: time.monotonic() - began >= MEASURED_SECONDS, 120)
    seconds = time.monotonic() - began
    writes = {ns: per_minute(counter.count(ns) - before[ns], seconds) for ns in before}
    operator = sum(w["total"] for w in writes.values()) - (asked[0] - asked_before) * 60 / seconds
    return {
        "seconds": round(seconds, 1),
        "calm_wake_s_p50": round(statistics.median(wakes), 3),
        "calm_wake_s_max": round(max(wakes), 3),
        "calm_wakes": [round(w, 3) for w in wakes],
        "calm_sleep_late_s_max": round(max(lates), 3),
        "cpu_s_per_s": round((cpu_seconds(pid) - cpu) / seconds, 3),
        "writes_per_min": writes,
        "total_writes_per_min": round(sum(w["total"] for w in writes.values()), 1),
        "operator_writes_per_min": round(operator, 1),
    }


def tenants(setup: Bench, counter: WriteCounter, args: argparse.Namespace) -> dict[str, Any]:
    count = args.flapping
    setup.engine(model="calm", token_seconds=0.002, wake_seconds=0.3)
    setup.pod_and_model("calm", state=None, spec={"idle": {"after": "2s"}})
    quiet_models(setup)
    hostiles = Hostiles(setup)
    # At its defaults: the probe interval (10 s) and the write budget (2 writes per interval
    # per model, twelve a minute) that come with it.
    setup.spawn("-m", "snooze.cli", "operator")
    pid = setup.procs[-1].pid
    report: dict[str, Any] = {"scene": "tenants", "rounds": args.rounds, "flapping": count}
    asked = [0]
    report["control"] = control = calm_phase(setup, counter, pid, args.rounds, asked)
    names = flapping_tenant(hostiles, count)
    wait_until("the flapping tenant labelled", lambda: labelled(setup, names) == count, 600)
    with churning(setup, names, asked):
        # Its bursts spent first: what it writes from then on is what it costs for good.
        spent = counter.count(FLAP_NS).total() + count * BURST_PER_MODEL * 2
        wait_until("its bursts spent", lambda: counter.count(FLAP_NS).total() >= spent, 600)
        flapping = calm_phase(setup, counter, pid, args.rounds, asked)
    flapping["ratio_to_control"] = {
        k: round(flapping[k] / control[k], 2) for k in ("calm_wake_s_p50", "calm_wake_s_max")
    }
    flapping["flap_budget_per_min"] = count * BUDGET_PER_MODEL
    report["flapping"] = flapping
    return report


# -- record: a wake asked while an engine's first record is under way -------------------------

CHECKSUM_SECONDS = 90.0
SIM_GIB = 16.0  # snooze sim's --gpu-memory-gib default


def model_state(setup: Bench, model: str) -> str | None:
    status = setup.api.get(f"/apis/snooze.dev/v1alpha1/namespaces/default/inferencemodels/{model}")
    pods = (status.json().get("status") or {}).get("pods") or [{}]
    state: str | None = pods[0].get("state")
    return state


def timed_wake(setup: Bench, model: str) -> float:
    """From the wake request to the model's status saying awake (what a gateway waits for)."""
    path = f"/apis/snooze.dev/v1alpha1/namespaces/default/inferencemodels/{model}"
    began = time.monotonic()
    stamp = {
        "metadata": {"annotations": {"snooze.dev/wake-requested-at": format_time(time.time())}}
    }
    setup.api.patch(path, json=stamp, headers=MERGE).raise_for_status()
    wait_until(f"{model} awake", lambda: model_state(setup, model) == "awake", 300)
    return time.monotonic() - began


def record(setup: Bench, counter: WriteCounter, args: argparse.Namespace) -> dict[str, Any]:
    """Control: a model woken from its sleep (no record to take). Then, for each of
    `--rounds` models whose engines hash their weights in CHECKSUM_SECONDS: its wake asked as
    its first drain's digests are under way."""
    del counter
    spec = {"idle": {"after": "2s"}, "wake": {"verify": False}}
    setup.engine(model="calm", token_seconds=0.002)
    setup.pod_and_model("calm", state=None, spec=spec)
    setup.spawn("-m", "snooze.cli", "operator", "--probe-interval", str(args.probe_interval))
    control = []
    for _ in range(args.rounds):
        wait_until("calm asleep", lambda: model_state(setup, "calm") == "asleep", 120)
        control.append(timed_wake(setup, "calm"))
    slow = []
    per_gib = str(CHECKSUM_SECONDS / SIM_GIB)
    for i in range(args.rounds):
        name, host = f"slow{i}", loopback(78, i + 2)
        setup.engine(model=name, token_seconds=0.002, host=host,
                     extra=("--checksum-seconds-per-gib", per_gib))  # fmt: skip
        setup.pod_and_model(name, state=None, spec={"idle": {"after": "2s"}}, host=host)
        # Its drain: the greedy answers take a moment, then the digests begin.
        wait_until(f"{name} draining", lambda n=name: model_state(setup, n) == "draining", 120)
        slow.append(timed_wake(setup, name))
    p50, slow_p50 = statistics.median(control), statistics.median(slow)
    return {
        "scene": "record",
        "checksum_seconds": CHECKSUM_SECONDS,
        "control_wake_s": [round(w, 3) for w in control],
        "during_record_wake_s": [round(w, 3) for w in slow],
        "ratio_p50": round(slow_p50 / p50, 2),
        "ratio_max": round(max(slow) / max(control), 2),
    }
