"""Benchmark: the operator's cost and promptness as the fleet grows (`--models N`, 2 engines each).

Three processes: the sandbox API (in this one, to count its requests), the engines
(`fleet_engines.py`, which stamps every probe) and the operator, measured alone through /proc.
1. Pods and models are created; traffic starts (one tiny request per engine every
   idle.after / 3, so nothing sleeps); then the operator starts; wait until every pod is
   labelled `awake`.
2. Steady state, `--steady` seconds: operator CPU and memory, API writes, and from the
   engines' side the gap between two probes of the same engine.
3. Traffic stops; each engine's last request's end is recorded, and a watch on pods sees
   when its `snooze.dev/state` label turns `asleep` (set once the engine confirmed its sleep).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import ipaddress
import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import yaml
from harness import CRD, NS, Bench, free_port, wait_until

from snooze.sandbox import Sandbox
from snooze.sandbox.emulator import SandboxEmulator

HERE = Path(__file__).resolve().parent
FIRST_ENGINE = ipaddress.ip_address("127.1.0.1")
STATE = "snooze.dev/state"
WRITES = ("POST", "PUT", "PATCH", "DELETE")
TICK = os.sysconf("SC_CLK_TCK")
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


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far, from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def memory_mb(pid: int) -> tuple[float, float]:
    """(resident now, peak resident) in MB, from /proc/PID/status."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) / 1024
    return values["VmRSS"], values["VmHWM"]


def percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p99": None, "max": None}
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {
        "p50": round(statistics.median(ordered), 3),
        "p99": round(p99, 3),
        "max": round(ordered[-1], 3),
    }


class PodStates:
    """A watch on pods in a thread: when each pod's state label last changed, and to what."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.state: dict[str, str | None] = {}
        self.since: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def summary(self) -> dict[str, int]:
        return dict(collections.Counter(str(v) for v in list(self.state.values())))

    def count(self, state: str) -> int:
        return sum(1 for value in list(self.state.values()) if value == state)

    def _run(self) -> None:
        params = {"watch": "true", "timeoutSeconds": "3600"}
        path = f"{self.url}/api/v1/namespaces/{NS}/pods"
        with httpx.stream("GET", path, params=params, timeout=None) as stream:
            for line in stream.iter_lines():
                if self._stop.is_set():
                    return
                if not line:
                    continue
                meta = json.loads(line)["object"]["metadata"]
                name = meta["name"]
                state = (meta.get("labels") or {}).get(STATE)
                if self.state.get(name, "-") != state:
                    self.state[name] = state
                    self.since[name] = time.time()


class Traffic:
    """One tiny completion per engine every `period` seconds, staggered, in a thread's loop."""

    def __init__(self, hosts: list[str], period: float) -> None:
        self.hosts = hosts
        self.period = period
        self.last_end: dict[str, float] = {}
        self.errors = 0
        self.sent = 0
        self._stopping = False
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        self._thread.join(self.period + 30)

    async def _main(self) -> None:
        connector = aiohttp.TCPConnector(limit=400)
        timeout = aiohttp.ClientTimeout(total=5)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            count = len(self.hosts)
            await asyncio.gather(
                *(
                    self._engine(session, h, self.period * i / count)
                    for i, h in enumerate(self.hosts)
                )
            )

    async def _engine(self, session: aiohttp.ClientSession, host: str, offset: float) -> None:
        await asyncio.sleep(offset)
        body = {"model": "m", "prompt": "hi", "max_tokens": 1}
        while not self._stopping:
            began = time.monotonic()
            try:
                async with session.post(f"http://{host}:8000/v1/completions", json=body) as reply:
                    await reply.read()
                    if reply.status == 200:
                        self.last_end[host] = time.time()
                    else:
                        self.errors += 1
            except (aiohttp.ClientError, TimeoutError):
                self.errors += 1
            self.sent += 1
            await asyncio.sleep(max(0.0, self.period - (time.monotonic() - began)))


def create_fleet(setup: Bench, models: int, idle_after: float) -> list[str]:
    """The CRD, two Ready pods per model (podIP: an engine's address) and the models."""
    crd = yaml.safe_load(CRD.read_text())
    setup.api.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd)
    pods = f"/api/v1/namespaces/{NS}/pods"
    hosts = [str(FIRST_ENGINE + i) for i in range(2 * models)]

    def one_model(index: int) -> None:
        name = f"m{index:04d}"
        for replica in range(2):
            pod = f"{name}-{replica}"
            response = setup.api.post(
                pods, json={"metadata": {"name": pod, "labels": {"app": name}}}
            )
            response.raise_for_status()
            status = {
                "phase": "Running",
                "podIP": hosts[2 * index + replica],
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
    n = args.models
    interval = args.probe_interval
    control = free_port()
    engines = spawn(
        setup, logs / "engines.log", str(HERE / "fleet_engines.py"),
        "--host", str(FIRST_ENGINE), "--count", str(2 * n), "--control-port", str(control),
    )  # fmt: skip
    control_url = f"http://127.0.0.1:{control}"
    watch = PodStates(setup.sandbox.url)
    watch.start()
    wait_until("the engines", lambda: httpx.get(control_url + "/probes").is_success, 120)
    began = time.monotonic()
    hosts = create_fleet(setup, n, args.idle_after)
    create_seconds = time.monotonic() - began
    traffic = Traffic(hosts, args.idle_after / 3)
    traffic.start()

    metrics_port = free_port()
    operator = spawn(
        setup, logs / "operator.log", "-m", "snooze.cli", "operator",
        "--probe-interval", str(interval), "--metrics-port", str(metrics_port),
    )  # fmt: skip
    pid = operator.pid
    cpu0 = cpu_seconds(pid)
    startup = wait_for(
        "every pod labelled awake",
        lambda: watch.count("awake") == 2 * n,
        args.startup_timeout,
        watch,
        operator,
    )
    startup_cpu = cpu_seconds(pid) - cpu0
    time.sleep(interval)  # one more probe round: first activity and status writes settle

    progress(f"steady state: measuring for {args.steady:.0f} s")
    httpx.post(control_url + "/reset")
    w0, c0, e0, b0, t0 = (
        writes(emulator), cpu_seconds(pid), cpu_seconds(engines.pid), cpu_seconds(os.getpid()),
        time.monotonic(),
    )  # fmt: skip
    rss_samples = []
    while time.monotonic() - t0 < args.steady:
        time.sleep(1)
        rss_samples.append(memory_mb(pid)[0])
    minutes = (time.monotonic() - t0) / 60
    w1 = writes(emulator)
    steady_cpu = (cpu_seconds(pid) - c0) / minutes
    engines_cpu = (cpu_seconds(engines.pid) - e0) / minutes
    bench_cpu = (cpu_seconds(os.getpid()) - b0) / minutes
    stamps: dict[str, list[float]] = httpx.get(control_url + "/probes", timeout=60).json()
    gaps = [b - a for s in stamps.values() for a, b in itertools.pairwise(s)]
    unprobed = sum(1 for s in stamps.values() if len(s) < 2)

    progress("stopping the traffic")
    traffic.stop()
    stopped = time.monotonic()
    c2 = cpu_seconds(pid)
    try:
        wait_for(
            "every pod labelled asleep",
            lambda: watch.count("asleep") == 2 * n,
            args.idle_after + 6 * interval + 60,
            watch,
            operator,
        )
        wave_complete = True
    except SystemExit as exc:  # still report what was measured: a missed target is a result
        progress(str(exc))
        wave_complete = False
    wave_cpu = (cpu_seconds(pid) - c2) / ((time.monotonic() - stopped) / 60)
    latencies = []
    for index, host in enumerate(hosts):
        pod = f"m{index // 2:04d}-{index % 2}"
        if host in traffic.last_end and watch.state.get(pod) == "asleep":
            latencies.append(watch.since[pod] - traffic.last_end[host] - args.idle_after)
    _, peak = memory_mb(pid)
    operator_metrics = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30)
    watch.stop()
    failed = operator.poll()
    if failed is not None:
        raise SystemExit(f"the operator exited with {failed}: see {logs / 'operator.log'}")
    return {
        "benchmark": "fleet",
        "models": n,
        "engines": 2 * n,
        "probe_interval_s": interval,
        "idle_after_s": args.idle_after,
        "create_s": round(create_seconds, 1),
        "startup_s": round(startup, 1),
        "startup_cpu_s": round(startup_cpu, 1),
        "probe_gap_s": percentiles(gaps),
        "probe_cycle_s": percentiles([g - interval for g in gaps]),
        "engines_unprobed": unprobed,
        "operator_cpu_s_per_min": round(steady_cpu, 2),
        "operator_cores": round(steady_cpu / 60, 3),
        "operator_cpu_s_per_min_sleep_wave": round(wave_cpu, 2),
        "operator_rss_mb": round(max(rss_samples), 1),
        "operator_peak_rss_mb": round(peak, 1),
        "api_writes_per_min": round((w1.total() - w0.total()) / minutes, 1),
        "api_writes_per_min_by_path": {k: round(v / minutes, 1) for k, v in (w1 - w0).items()},
        "idle_to_asleep_beyond_idle_after_s": percentiles(latencies),
        "asleep_measured": len(latencies),
        "sleep_wave_complete": wave_complete,
        "traffic_requests": traffic.sent,
        "traffic_errors": traffic.errors,
        "engines_process_cpu_s_per_min": round(engines_cpu, 1),
        "bench_process_cpu_s_per_min": round(bench_cpu, 1),
        "operator_metrics_bytes": len(operator_metrics.content),
        "loadavg_1m_at_end": float(Path("/proc/loadavg").read_text().split()[0]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=10)
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
