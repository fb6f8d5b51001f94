"""Benchmark: what hostile engines cost the operator and the other models.

One calm model (a `snooze sim` engine, `idle.after` 2 s) is woken and left to sleep, round
after round, while the operator (a process of its own) also probes, in turn: nothing else
(the baseline), one engine whose `/metrics` answer is 300 MB, 200 engines that drip their
answer a byte at a time, and, for comparison, 200 engines that answer as they should
(hostile_engines.py, another process). Each phase begins as its engines' model is created.
Reports the operator's resident memory (now and its peak, from /proc/PID/status; the peak is
reset between phases), its CPU, and the calm model's wake (the wake request to its status
saying awake) and its sleep (how long after idle.after it came), each phase against the
baseline as ratios, and what the hostile model's status says in the end.

Then the gateway's scenes (hostile_gateway.py): a 300 MB answer, a stream nobody reads, an
engine that lies about being awake, and a flood of idle connections, each beside its control.

Usage: python hostile.py [--rounds 5] [--huge-mb 300] [--drips 200]
With `--scene loops`, `--scene tenants` (and `--flapping 200`) or `--scene record`, the
operator's own scenes instead (hostile_operator.py).
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import hostile_gateway
import httpx
from harness import NS, Bench, WriteCounter, bench, free_port, loopback, wait_until

from snooze.api.times import format_time

HONEST = 'vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:engine_sleep_state{sleep_state="awake"} 1\n'  # noqa: E501
IDLE_AFTER = 2.0
MODELS = f"/apis/snooze.dev/v1alpha1/namespaces/{NS}/inferencemodels"
MERGE = {"Content-Type": "application/merge-patch+json"}


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (the peak) of a process, in kB."""
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0])
    return found


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0  # utime + stime, in clock ticks


def pod_state(setup: Bench, model: str, pod: str) -> str | None:
    status = setup.api.get(f"{MODELS}/{model}").json().get("status") or {}
    for entry in status.get("pods") or []:
        if entry.get("name") == pod:
            state: str | None = entry.get("state")
            return state
    return None


def wait_for(setup: Bench, state: str, timeout: float = 120.0) -> float:
    wait_until(f"calm-0 {state}", lambda: pod_state(setup, "calm", "calm-0") == state, timeout)
    return time.monotonic()


def rounds_of(setup: Bench, rounds: int) -> tuple[list[float], list[float]]:
    """Wake the calm model and let it sleep again, `rounds` times: wake latencies, and how
    long after idle.after each sleep came."""
    wakes, lates = [], []
    wait_for(setup, "asleep")
    for _ in range(rounds):
        began = time.monotonic()
        stamp = format_time(time.time())
        annotation = {"metadata": {"annotations": {"snooze.dev/wake-requested-at": stamp}}}
        setup.api.patch(f"{MODELS}/calm", json=annotation, headers=MERGE).raise_for_status()
        awake = wait_for(setup, "awake")
        wakes.append(awake - began)
        lates.append(wait_for(setup, "asleep") - awake - IDLE_AFTER)
    return wakes, lates


def measure(setup: Bench, pid: int, rounds: int) -> dict[str, Any]:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    cpu = cpu_seconds(pid)
    began = time.monotonic()
    wakes, lates = rounds_of(setup, rounds)
    seconds = time.monotonic() - began
    memory = proc_status(pid)
    return {
        "wake_s_p50": round(statistics.median(wakes), 3),
        "wake_s_max": round(max(wakes), 3),
        "wakes": [round(w, 3) for w in wakes],
        "sleep_late_s_p50": round(statistics.median(lates), 3),
        "sleep_late_s_max": round(max(lates), 3),
        "rss_mib": round(memory["VmRSS"] / 1024, 1),
        "peak_rss_mib": round(memory["VmHWM"] / 1024, 1),
        "cpu_s_per_s": round((cpu_seconds(pid) - cpu) / seconds, 3),
    }


class Hostiles:
    """The hostile engines' process, and the pods and model that make the operator probe them."""

    def __init__(self, setup: Bench) -> None:
        self.setup = setup
        self.port = free_port()
        setup.spawn(str(Path(__file__).with_name("hostile_engines.py")), "--control-port",
                    str(self.port))  # fmt: skip
        self.control = f"http://127.0.0.1:{self.port}/engines"
        wait_until("the hostile engines", lambda: httpx.get(self.control).status_code == 200)
        self.next = 0

    def address(self) -> Any:
        """An address no hostile engine had yet."""
        self.next += 1
        return ipaddress.ip_address(loopback(79, 2)) + self.next - 1

    @contextmanager
    def model(self, name: str, count: int, **behaviour: Any) -> Iterator[list[str]]:
        hosts = self.add(name, count, **behaviour)
        try:
            yield hosts
        finally:
            self.remove(name, count)

    def add(
        self,
        name: str,
        count: int,
        *,
        namespace: str = NS,
        annotations: dict[str, str] | None = None,
        spec: dict[str, Any] | None = None,
        **behaviour: Any,
    ) -> list[str]:
        """`count` hostile engines of `behaviour`, their Ready pods, and a model of them."""
        api = self.setup.api
        pods = f"/api/v1/namespaces/{namespace}/pods"
        hosts = [str(self.address()) for _ in range(count)]
        labels = {"app": name}
        for i, host in enumerate(hosts):
            httpx.post(self.control, json={"host": host, **behaviour}).raise_for_status()
            pod = {"metadata": {"name": f"{name}-{i}", "labels": labels}}
            api.post(pods, json=pod).raise_for_status()
            ready = {"phase": "Running", "podIP": host}
            ready["conditions"] = [{"type": "Ready", "status": "True"}]  # type: ignore[assignment]
            api.patch(f"{pods}/{name}-{i}/status", json={"status": ready}, headers=MERGE)
        body = {
            "apiVersion": "snooze.dev/v1alpha1",
            "kind": "InferenceModel",
            "metadata": {"name": name, "annotations": annotations or {}},
            "spec": {"selector": {"matchLabels": labels}, "idle": {"after": "1m"}, **(spec or {})},
        }
        models = f"/apis/snooze.dev/v1alpha1/namespaces/{namespace}/inferencemodels"
        api.post(models, json=body).raise_for_status()
        return hosts

    def remove(self, name: str, count: int, *, namespace: str = NS) -> None:
        api = self.setup.api
        api.delete(f"/apis/snooze.dev/v1alpha1/namespaces/{namespace}/inferencemodels/{name}")
        for i in range(count):
            api.delete(f"/api/v1/namespaces/{namespace}/pods/{name}-{i}")

    def sent(self, hosts: list[str]) -> dict[str, int]:
        report = httpx.get(self.control).json()
        return {
            "requests": sum(sum(report[h]["requests"].values()) for h in hosts),
            "bytes_sent": sum(report[h]["sent"] for h in hosts),
        }


def status_of(setup: Bench, model: str) -> dict[str, Any]:
    status = setup.api.get(f"{MODELS}/{model}").json().get("status") or {}
    pods = status.get("pods") or [{}]
    return {"state": pods[0].get("state"), "message": pods[0].get("message")}


def probe_failures(metrics_url: str) -> dict[str, float]:
    """snooze_probe_failures_total by model and reason (empty where the operator has none)."""
    found: dict[str, float] = {}
    for line in httpx.get(metrics_url).text.splitlines():
        if line.startswith("snooze_probe_failures_total{"):
            labels, value = line.rsplit(" ", 1)
            found[labels.split("{", 1)[1].rstrip("}")] = float(value)
    return found


def ratios(phase: dict[str, Any], baseline: dict[str, Any]) -> dict[str, float]:
    keys = ("wake_s_p50", "wake_s_max", "peak_rss_mib", "cpu_s_per_s")
    return {k: round(phase[k] / baseline[k], 2) if baseline[k] else 0.0 for k in keys}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="wakes and sleeps per phase")
    parser.add_argument("--huge-mb", type=int, default=300, help="the huge page's size")
    parser.add_argument("--drips", type=int, default=200, help="how many engines drip")
    parser.add_argument("--probe-interval", type=float, default=1.0)
    parser.add_argument(
        "--scene", choices=["engines", "loops", "tenants", "record"], default="engines"
    )
    parser.add_argument("--flapping", type=int, default=200, help="the flapping tenant's models")
    parser.add_argument(
        "--operator-pythonpath",
        help="run the operator (and the simulated engines) from this source tree, to measure "
        "another version of it",
    )
    args = parser.parse_args()
    if args.scene != "engines":
        import hostile_operator

        counter = WriteCounter()
        with bench(counter) as setup:
            if args.operator_pythonpath:
                setup.env["PYTHONPATH"] = args.operator_pythonpath
            print(json.dumps(getattr(hostile_operator, args.scene)(setup, counter, args)))
        return
    with bench() as setup:
        setup.engine(model="calm", token_seconds=0.002, wake_seconds=0.3)
        setup.pod_and_model("calm", state=None, spec={"idle": {"after": f"{IDLE_AFTER:g}s"}})
        hostiles = Hostiles(setup)
        metrics = f"http://127.0.0.1:{free_port()}/metrics"
        setup.spawn("-m", "snooze.cli", "operator", "--probe-interval", str(args.probe_interval),
                    "--metrics-port", metrics.rsplit(":", 1)[1].split("/")[0])  # fmt: skip
        pid = setup.procs[-1].pid
        report: dict[str, Any] = {"benchmark": "hostile", "rounds": args.rounds}
        log: Callable[[str], None] = lambda what: print(what, file=sys.stderr, flush=True)  # noqa: E731
        log("baseline")
        baseline = report["baseline"] = measure(setup, pid, args.rounds)
        phases = {
            "huge": ("huge", 1, {"kind": "huge", "bytes": args.huge_mb * 1_000_000}),
            "drip": ("drip", args.drips, {"kind": "drip", "interval": 0.1}),
            # As many engines, well behaved: what the drip costs beyond their number.
            "honest": ("honest", args.drips, {"kind": "page", "text": HONEST}),
        }
        for phase, (name, count, behaviour) in phases.items():
            log(phase)
            with hostiles.model(name, count, **behaviour) as hosts:
                result = measure(setup, pid, args.rounds)
                result["ratio_to_baseline"] = ratios(result, baseline)
                if phase != "honest":  # how the hostile model's status ends up
                    with contextlib.suppress(SystemExit):
                        wait_until(
                            f"{name} unreachable",
                            lambda n=name: status_of(setup, n)["state"] == "unreachable",
                            timeout=120,
                        )
                result["hostile_engines"] = {**hostiles.sent(hosts), "count": count}
                result["hostile_status"] = status_of(setup, name)
                report[phase] = result
        report["probe_failures"] = probe_failures(metrics)
    log("gateway")  # the gateway's scenes, in a sandbox of their own (hostile_gateway.py)
    report["gateway"] = hostile_gateway.scenes(args.huge_mb)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
