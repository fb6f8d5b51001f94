"""Benchmark: the operator's cost and promptness as the fleet grows (`--models N`, with
`--engines-per-model K`, 2 by default).

Three or four processes: the sandbox API (in this one, to count its requests), the engines
(`fleet_engines.py`, which stamps every probe; one process per 2,500 engines), the operator,
measured alone through /proc, and with `--through-gateway` the gateway, whose per-engine
counters the operator reads.
1. Pods and models are created; traffic starts (one tiny request per engine every
   idle.after / 3, so nothing sleeps: straight to the engines, or through the gateway by
   model); then the operator starts; wait until every pod is labelled `awake`.
2. Steady state, `--steady` seconds: operator CPU and memory, API writes, and from the
   engines' side the gap between two probes of the same engine.
3. Traffic stops; each engine's last request's end is recorded (by the traffic, or by the
   gateway's per-engine counters), and a watch on pods sees when its `snooze.dev/state`
   label turns `asleep` (set once the engine confirmed its sleep).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import ipaddress
import itertools
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import yaml
from fleet_load import PodStates, Traffic, cpu_seconds, memory_mb, percentiles
from harness import CRD, NS, Bench, free_port, loopback, wait_until

from snooze.operator.traffic.gateways import read_page
from snooze.sandbox import Sandbox
from snooze.sandbox.emulator import SandboxEmulator

HERE = Path(__file__).resolve().parent
# One process of simulated engines serves at most this many (file descriptors, see measure).
ENGINES_PER_PROCESS = 2500
WRITES = ("POST", "PUT", "PATCH", "DELETE")
NAME = re.compile(r"/m\d{4}(-\d)?(?=/|$)")


class CountingEmulator(SandboxEmulator):
    """The sandbox's emulator, also counting requests by method and path (names elided)."""

    def __init__(self) -> None:
        super().__init__()
        self.by_path: collections.Counter[str] = collections.Counter()

    def _take_fault(self, method: str, path_qs: str) -> Any:
        path = NAME.sub("/*", path_qs.partition("?")[0])
        self.by_path[f"{method} {path}"] += 1
        return super()._take_fault(method, path_qs)


def first_engine() -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """The first engine's address; the others follow it (harness.loopback's octet)."""
    return ipaddress.ip_address(loopback(0, 1))


def pod_name(engine: int, per_model: int) -> str:
    return f"m{engine // per_model:04d}-{engine % per_model}"


def create_fleet(setup: Bench, models: int, per_model: int, idle_after: float) -> list[str]:
    """The CRD, `per_model` Ready pods per model (podIP: an engine's address) and the models."""
    crd = yaml.safe_load(CRD.read_text())
    setup.api.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd)
    pods = f"/api/v1/namespaces/{NS}/pods"
    hosts = [str(first_engine() + i) for i in range(per_model * models)]

    def one_model(index: int) -> None:
        name = f"m{index:04d}"
        for replica in range(per_model):
            pod = f"{name}-{replica}"
            response = setup.api.post(
                pods, json={"metadata": {"name": pod, "labels": {"app": name}}}
            )
            response.raise_for_status()
            status = {
                "phase": "Running",
                "podIP": hosts[per_model * index + replica],
                "conditions": [{"type": "Ready", "status": "True"}],
            }
            setup.api.patch(
                f"{pods}/{pod}/status",
                json={"status": status},
                headers={"Content-Type": "application/merge-patch+json"},
            ).raise_for_status()
        body = {
            "apiVersion": "snooze.dev/v1alpha1",
            "kind": "InferenceModel",
            "metadata": {"name": name},
            "spec": {
                "selector": {"matchLabels": {"app": name}},
                "idle": {"after": f"{idle_after:g}s"},
            },
        }
        setup.api.post(
            f"/apis/snooze.dev/v1alpha1/namespaces/{NS}/inferencemodels", json=body
        ).raise_for_status()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one_model, range(models)))
    return hosts


def progress(message: str) -> None:
    print(f"fleet: {time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


def wait_for(
    what: str, check: Any, timeout: float, watch: PodStates, operator: subprocess.Popen[bytes]
) -> float:
    """Seconds until `check()` held, showing pod states; exits after `timeout`."""
    progress(f"waiting for {what} (at most {timeout:.0f} s)")
    began = time.monotonic()
    shown = began
    while not check():
        if operator.poll() is not None:
            raise SystemExit(f"fleet: the operator exited with {operator.returncode}")
        now = time.monotonic()
        if now - began > timeout:
            raise SystemExit(f"fleet: timed out waiting for {what}: pods {watch.summary()}")
        if now - shown > 15:
            progress(f"pods {watch.summary()}")
            shown = now
        time.sleep(0.1)
    return time.monotonic() - began


def spawn(setup: Bench, log: Path, *args: str) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, *args], env=setup.env, stdout=out, stderr=subprocess.STDOUT
        )
    setup.procs.append(proc)
    return proc


def writes(emulator: CountingEmulator) -> collections.Counter[str]:
    """Write requests so far, by method and path."""
    return collections.Counter(
        {k: v for k, v in emulator.by_path.copy().items() if k.split()[0] in WRITES}
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    logs = Path(args.logs)
    logs.mkdir(parents=True, exist_ok=True)
    sandbox = Sandbox()
    emulator = sandbox.emulator = CountingEmulator()
    with tempfile.TemporaryDirectory() as tmp, sandbox:
        setup = Bench(sandbox, Path(tmp))
        if args.operator_pythonpath:
            setup.env["PYTHONPATH"] = args.operator_pythonpath
        try:
            return measure(args, setup, emulator, logs)
        finally:
            setup.close()


def measure(
    args: argparse.Namespace, setup: Bench, emulator: CountingEmulator, logs: Path
) -> dict[str, Any]:
    n, per = args.models, args.engines_per_model
    engines_total = n * per
    interval = args.probe_interval
    # Several engine processes past ENGINES_PER_PROCESS: each engine is a listening socket plus
    # the connections kept to it, and one process of 10,000 ran out of file descriptors.
    chunks = math.ceil(engines_total / ENGINES_PER_PROCESS)
    engine_processes, control_urls = [], []
    for chunk in range(chunks):
        begin = chunk * ENGINES_PER_PROCESS
        count = min(ENGINES_PER_PROCESS, engines_total - begin)
        control = free_port()
        engine_processes.append(
            spawn(
                setup,
                logs / f"engines-{chunk}.log",
                str(HERE / "fleet_engines.py"),
                *("--host", str(first_engine() + begin), "--count", str(count)),
                *("--per-model", str(per), "--first-index", str(begin)),
                *("--control-port", str(control)),
            )
        )
        control_urls.append(f"http://127.0.0.1:{control}")
    watch = PodStates(setup.sandbox.url)
    watch.start()
    for url in control_urls:
        wait_until("the engines", lambda url=url: httpx.get(url + "/probes").is_success, 300)
    began = time.monotonic()
    hosts = create_fleet(setup, n, per, args.idle_after)
    create_seconds = time.monotonic() - began

    operator_args = ["--probe-interval", str(interval)]
    gateway: subprocess.Popen[bytes] | None = None
    if args.through_gateway:
        port, gateway_metrics = free_port(), free_port()
        gateway = spawn(
            setup, logs / "gateway.log", "-m", "snooze.cli", "gateway", "--host", "127.0.0.1",
            "--port", str(port), "--metrics-port", str(gateway_metrics),
        )  # fmt: skip
        gateway_url = f"http://127.0.0.1:{gateway_metrics}/metrics"
        wait_until("the gateway's metrics", lambda: httpx.get(gateway_url).is_success, 60)
        health = f"http://127.0.0.1:{port}/healthz"
        wait_until("the gateway", lambda: httpx.get(health).is_success, 60)
        operator_args += ["--gateway-metrics", gateway_url]
    # Until every pod is labelled, traffic goes straight to the engines (so that none sleeps
    # while the operator starts); through the gateway, it moves there once all are awake.
    direct = [
        (f"http://{host}:8000/v1/completions", f"m{i // per:04d}", host)
        for i, host in enumerate(hosts)
    ]
    traffic = Traffic(direct, args.idle_after / 3)
    traffic.start()

    metrics_port = free_port()
    operator = spawn(
        setup, logs / "operator.log", "-m", "snooze.cli", "operator",
        "--metrics-port", str(metrics_port), *operator_args,
    )  # fmt: skip
    pid = operator.pid
    cpu0 = cpu_seconds(pid)
    startup = wait_for(
        "every pod labelled awake",
        lambda: watch.count("awake") == engines_total,
        args.startup_timeout,
        watch,
        operator,
    )
    startup_cpu = cpu_seconds(pid) - cpu0
    if gateway is not None:
        # Each model's engines get their share through the gateway, which takes turns among
        # them; the operator reads the gateway's counters instead of probing them.
        through = [
            (f"http://127.0.0.1:{port}/v1/completions", f"m{i // per:04d}", str(i))
            for i in range(engines_total)
        ]
        moved = Traffic(through, args.idle_after / 3, timeout=60)
        moved.start()
        traffic.stop()
        moved.absorb(traffic)
        traffic = moved
    # Two more probe rounds: first activity, status writes and the judgment of each engine's
    # traffic (direct or through the gateway) settle.
    time.sleep(2 * interval)

    progress(f"steady state: measuring for {args.steady:.0f} s")
    for url in control_urls:
        httpx.post(url + "/reset")
    processes = {"operator": pid, "bench": os.getpid()}
    processes |= {f"engines-{i}": p.pid for i, p in enumerate(engine_processes)}
    if gateway is not None:
        processes["gateway"] = gateway.pid
    w0, t0 = writes(emulator), time.monotonic()
    cpu0s = {name: cpu_seconds(p) for name, p in processes.items()}
    rss_samples = []
    while time.monotonic() - t0 < args.steady:
        time.sleep(1)
        rss_samples.append(memory_mb(pid)[0])
    minutes = (time.monotonic() - t0) / 60
    w1 = writes(emulator)
    cpu_per_min = {name: (cpu_seconds(p) - cpu0s[name]) / minutes for name, p in processes.items()}
    stamps: dict[str, list[float]] = {}
    for url in control_urls:
        stamps |= httpx.get(url + "/probes", timeout=60).json()
    for name in [n for n in cpu_per_min if n.startswith("engines-")]:
        cpu_per_min["engines"] = cpu_per_min.get("engines", 0.0) + cpu_per_min.pop(name)
    gaps = [b - a for s in stamps.values() for a, b in itertools.pairwise(s)]
    probes_per_min = sum(len(s) for s in stamps.values()) / minutes
    unprobed = sum(1 for s in stamps.values() if len(s) < 2)

    progress("stopping the traffic")
    traffic.stop()
    stopped = time.monotonic()
    for url in control_urls:  # from here on the engines stamp the wave's probes
        httpx.post(url + "/reset")
    w2 = writes(emulator)
    last_end = last_requests(traffic, hosts, per, gateway_url if gateway else None)
    c2 = cpu_seconds(pid)
    try:
        wait_for(
            "every pod labelled asleep",
            lambda: watch.count("asleep") == engines_total,
            args.idle_after + 6 * interval + 60,
            watch,
            operator,
        )
        wave_complete = True
    except SystemExit as exc:  # still report what was measured: a missed target is a result
        progress(str(exc))
        wave_complete = False
    wave_cpu = (cpu_seconds(pid) - c2) / ((time.monotonic() - stopped) / 60)
    wave_writes = writes(emulator) - w2
    wave_probes = 0
    for url in control_urls:
        wave_probes += sum(len(s) for s in httpx.get(url + "/probes", timeout=60).json().values())
    latencies = [
        watch.since[pod] - end - args.idle_after
        for pod, end in last_end.items()
        if watch.state.get(pod) == "asleep"
    ]
    _, peak = memory_mb(pid)
    operator_metrics = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30)
    watch.stop()
    failed = operator.poll()
    if failed is not None:
        raise SystemExit(f"the operator exited with {failed}: see {logs / 'operator.log'}")
    return {
        "benchmark": "fleet",
        "models": n,
        "engines": engines_total,
        "traffic_through": "gateway" if gateway else "engines",
        "probe_interval_s": interval,
        "idle_after_s": args.idle_after,
        "create_s": round(create_seconds, 1),
        "startup_s": round(startup, 1),
        "startup_cpu_s": round(startup_cpu, 1),
        "probe_gap_s": percentiles(gaps),
        "probes_per_min": round(probes_per_min),
        "engines_unprobed": unprobed,
        "operator_cpu_s_per_min": round(cpu_per_min["operator"], 2),
        "operator_cores": round(cpu_per_min["operator"] / 60, 3),
        "operator_cpu_s_per_min_sleep_wave": round(wave_cpu, 2),
        "operator_rss_mb": round(max(rss_samples), 1),
        "operator_peak_rss_mb": round(peak, 1),
        "api_writes_per_min": round((w1.total() - w0.total()) / minutes, 1),
        "api_writes_per_min_by_path": {k: round(v / minutes, 1) for k, v in (w1 - w0).items()},
        "idle_to_asleep_beyond_idle_after_s": percentiles(latencies),
        "idle_to_asleep_beyond_idle_after_intervals_p99": None
        if not latencies
        else round(percentiles(latencies)["p99"] / interval, 2),  # type: ignore[operator]
        "asleep_measured": len(latencies),
        "sleep_wave_complete": wave_complete,
        # What each engine cost from the end of the traffic to the end of the wave.
        "wave_probes_per_engine": round(wave_probes / engines_total, 2),
        "wave_api_writes_per_engine_by_path": {
            k: round(v / engines_total, 2) for k, v in wave_writes.items()
        },
        "traffic_requests": traffic.sent,
        "traffic_errors": traffic.errors,
        "traffic_failures": dict(traffic.failures),
        "traffic_retried_503": dict(traffic.retried),
        "cpu_s_per_min_by_process": {k: round(v, 1) for k, v in cpu_per_min.items()},
        "operator_metrics_bytes": len(operator_metrics.content),
        "loadavg_1m_at_end": float(Path("/proc/loadavg").read_text().split()[0]),
    }


def last_requests(
    traffic: Traffic, hosts: list[str], per: int, gateway_metrics: str | None
) -> dict[str, float]:
    """When each pod's engine last ended a request: as the traffic saw it (straight to the
    engines), or as the gateway's per-engine counters say (through the gateway)."""
    if gateway_metrics is None:
        return {
            pod_name(i, per): traffic.last_end[host]
            for i, host in enumerate(hosts)
            if host in traffic.last_end
        }
    page = read_page(httpx.get(gateway_metrics, timeout=30).text)
    return {pod: t.last for (_, pod), t in page.items() if t.last is not None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=10)
    parser.add_argument("--engines-per-model", type=int, default=2)
    parser.add_argument(
        "--through-gateway",
        action="store_true",
        help="send the traffic through a gateway whose counters the operator reads",
    )
    parser.add_argument("--probe-interval", type=float, default=10.0)
    parser.add_argument("--idle-after", type=float, default=45.0, help="seconds")
    parser.add_argument("--steady", type=float, default=60.0, help="seconds measured")
    parser.add_argument("--startup-timeout", type=float, default=180.0)
    parser.add_argument(
        "--operator-pythonpath",
        default="",
        help="run the operator from this source tree instead (to measure a proposed fix)",
    )
    parser.add_argument("--logs", default="/tmp/snooze-fleet", help="process logs go here")
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        print(json.dumps(run(args)))


if __name__ == "__main__":
    main()
