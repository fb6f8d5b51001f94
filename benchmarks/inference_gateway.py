"""Benchmark: behind the Inference Gateway, on the real control plane of the cluster tests.

docs/inference-gateway.md's example (examples/inference-gateway/: its InferencePool, its picker
with flow control on, its vLLM pod with the gate `snooze.dev/awake`, one replica, the engine
simulated) and the chart with inferenceGateway.enabled. The engine is reached three ways in
the same run: through the endpoint picker (client -> extproc-proxy, the stand-in for Envoy ->
the real picker v1.5.0 over ext_proc -> the engine; Snooze is not in that data path), through
Snooze's gateway pod, and directly; JSON and streaming, at 16 and 64 clients. Then the wake
latency, from a request sent to the sleeping model to its whole answer, on each path: through
the picker (the picker holds it in its flow-control queue, Snooze reads the queue and wakes
the engine, the gate opens, the picker dispatches), through Snooze's gateway (it holds the
request and asks for the wake), and directly (the engine's own /wake_up, then the request:
the floor).

It starts a whole test cluster of its own (tests/cluster: root, network namespaces, the
binaries of `bash tests/k8s/build`), refused while another one runs (the cluster tests'); run
it as root from this directory: `python inference_gateway.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import helm_python
import httpx
from gateway import percentile

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "cluster"), str(ROOT / "tests")]

from cluster import IMAGE, LocalCluster  # noqa: E402
from kube import Kube, wait_for  # noqa: E402
from picker import (  # noqa: E402
    PICKER_IMAGE,
    engines_and_model,
    picker_image,
    pool_and_picker,
    pool_crd,
    proxy,
)

from snooze.policy.sleep import REQUEST_RESOLUTION_SECONDS  # noqa: E402

NAMESPACE = "default"  # examples/inference-gateway's
SYSTEM = "snooze-system"
MODEL = "qwen3-8b"
SERVED = "Qwen/Qwen3-8B"
LABEL = f"app.kubernetes.io/name={MODEL}"
PICKER = "inferencepool=qwen3-8b-epp"
GATE = "snooze.dev/awake"
TOKEN_SECONDS = 0.002
MAX_TOKENS = 8
WAKE_SECONDS = 0.3
KV_WAKE_SECONDS = 0.05  # the simulator's default, part of every wake
BODY = {"model": SERVED, "messages": [{"role": "user", "content": "hi"}], "max_tokens": MAX_TOKENS}


def engine_and_model(desired: str) -> list[dict[str, Any]]:
    """The example's one engine (simulated, as fast as gateway.py's) and its InferenceModel,
    never asleep for idleness here: the benchmark puts it to sleep with desiredState."""
    sim = ["--token-seconds", str(TOKEN_SECONDS), "--max-concurrency", "512",
           "--wake-seconds", str(WAKE_SECONDS), "--sleep-seconds", "0.05",
           "--checksum-seconds-per-gib", "0"]  # fmt: skip
    deployment, model = engines_and_model(f"{IMAGE}:dev", sim, replicas=1)
    model["spec"]["idle"] = {"after": "1h"}
    model["spec"]["desiredState"] = desired
    return [deployment, model]


def model(desired: str) -> dict[str, Any]:
    return engine_and_model(desired)[1]


@contextlib.contextmanager
def cluster(probe_interval: str, picker_interval: str) -> Iterator[Kube]:
    """The test cluster, Snooze's CRDs, and its chart installed as the cluster tests do."""
    local = LocalCluster()
    local.start()
    assert local.control is not None and local.runtime is not None
    kube = Kube(local.admin_kubeconfig, kubectl=str(local.control.bin / "kubectl"), local=local)
    try:
        kube.kubectl("apply", "-f", str(ROOT / "crds"))
        values = {
            "image": {"repository": IMAGE, "tag": "dev"},
            "operator": {"probeInterval": probe_interval},
            "inferenceGateway": {"enabled": True, "pickerInterval": picker_interval},
        }
        with helm_python.Config(kubeconfig_path=str(kube.kubeconfig), namespace=SYSTEM) as helm:
            helm.install(str(ROOT / "charts" / "snooze"), "snooze", values, namespace=SYSTEM,
                         create_namespace=True, wait="watcher", timeout=180)  # fmt: skip
        yield kube
    finally:
        kube.close()
        local.stop()


def cpu_seconds(pid: int) -> float:
    """The CPU time (user and system, every thread) the process `pid` has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # utime and stime, the 14th and 15th fields
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Sample:
    """What one path gave over its slices of a measurement."""

    latencies: list[float] = field(default_factory=list)
    elapsed: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        done = len(self.latencies)
        return {
            "rps": round(done / self.elapsed, 1),
            "p50_ms": round(1000 * statistics.median(self.latencies), 2),
            "p99_ms": round(1000 * percentile(self.latencies, 0.99), 2),
            "cpu_ms_per_request": {k: round(1000 * v / done, 3) for k, v in self.cpu.items()},
        }


async def load(
    url: str, sample: Sample, *, clients: int, stream: bool, seconds: float, pids: dict[str, int]
) -> None:
    """`clients` loops sending back-to-back requests for `seconds`, into `sample`: each
    whole answer's latency, and the CPU each process of `pids` (those between the client and
    the engine) spent meanwhile."""
    cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    body = {**BODY, "stream": stream}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        end = time.monotonic() + seconds

        async def client() -> None:
            while time.monotonic() < end:
                began = time.monotonic()
                async with session.post(url + "/v1/chat/completions", json=body) as response:
                    await response.read()
                    assert response.status == 200, (url, response.status)
                sample.latencies.append(time.monotonic() - began)

        began = time.monotonic()
        await asyncio.gather(*(client() for _ in range(clients)))
        sample.elapsed += time.monotonic() - began
    for name, pid in pids.items():
        sample.cpu[name] = sample.cpu.get(name, 0.0) + cpu_seconds(pid) - cpu_before[name]


async def throughput(
    paths: dict[str, str], between: dict[str, dict[str, int]], seconds: float, slices: int
) -> list[dict[str, Any]]:
    """Each setting measured for `seconds` on each path, in `slices` turns taken in rotation:
    a machine whose other load comes and goes weighs on every path alike."""
    rows = []
    for stream in (False, True):
        for clients in (16, 64):
            samples = {name: Sample() for name in paths}
            for url in paths.values():  # warm up each process on the way
                await load(url, Sample(), clients=clients, stream=stream, seconds=0.5, pids={})
            for _ in range(slices):
                for name, url in paths.items():
                    await load(url, samples[name], clients=clients, stream=stream,
                               seconds=seconds / slices, pids=between[name])  # fmt: skip
            measured = {name: sample.summary() for name, sample in samples.items()}
            direct = measured["direct"]
            row: dict[str, Any] = {"stream": stream, "clients": clients, **measured}
            for name in ("picker", "gateway"):
                row[f"{name}_throughput_ratio"] = round(measured[name]["rps"] / direct["rps"], 3)
                row[f"{name}_added_p50_ms"] = round(measured[name]["p50_ms"] - direct["p50_ms"], 2)
                row[f"{name}_added_p99_ms"] = round(measured[name]["p99_ms"] - direct["p99_ms"], 2)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    return rows


def container_pid(kube: Kube, pod: Any) -> int:
    """The process of the pod's (one) container, as the runtime started it: `ip netns exec`,
    `unshare` and the shell all exec, so it is the program itself."""
    assert kube.local is not None and kube.local.runtime is not None
    runner = kube.local.runtime.runner(pod.metadata.namespace, pod.metadata.name)
    assert runner is not None and runner.containers[0].popen is not None
    return runner.containers[0].popen.pid


def engine_pod(kube: Kube) -> Any:
    pods = [p for p in kube.pods(NAMESPACE, LABEL) if p.metadata.deletion_timestamp is None]
    return pods[0] if len(pods) == 1 else None


def gate(kube: Kube) -> str:
    pod = engine_pod(kube)
    said = {c.type: c.status for c in (pod.status.conditions or [])} if pod else {}
    return str(said.get(GATE, ""))


def put_to_sleep(kube: Kube, engine_url: str) -> None:
    """desiredState Asleep until the engine sleeps and its gate is False, then Auto again: the
    next request is the one that wakes it."""
    kube.apply(model("Asleep"))
    wait_for("the engine asleep, its gate False", lambda: gate(kube) == "False" and httpx.get(
        engine_url + "/is_sleeping").json()["is_sleeping"], timeout=60)  # fmt: skip
    kube.apply(model("Auto"))

    def seen() -> bool:
        found = kube.get("im", MODEL, NAMESPACE)
        return bool(found["status"].get("observedGeneration") == found["metadata"]["generation"])

    wait_for("the operator to see Auto", seen)


def timed(url: str) -> float:
    began = time.monotonic()
    answer = httpx.post(url + "/v1/chat/completions", json=BODY, timeout=120)
    assert answer.status_code == 200, (url, answer.status_code, answer.text)
    return time.monotonic() - began


def wakes(kube: Kube, paths: dict[str, str], engine_url: str, rounds: int) -> dict[str, Any]:
    seconds: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(rounds):
        for name, url in paths.items():
            put_to_sleep(kube, engine_url)
            if name == "direct":
                # No one holds a request for it: the client wakes the engine, then asks.
                began = time.monotonic()
                httpx.post(engine_url + "/wake_up", timeout=60).raise_for_status()
                seconds[name].append(time.monotonic() - began + timed(url))
            else:
                seconds[name].append(timed(url))
            print(json.dumps({"wake": name, "seconds": round(seconds[name][-1], 3)}),
                  file=sys.stderr)  # fmt: skip
            if name == "direct":
                # Snooze learns of a wake it did not make only at its slow drift probe: tell it
                # to wake the engine (awake already) so that it opens the gate again now.
                kube.apply(model("Awake"))
            wait_for("the gate open again", lambda: gate(kube) == "True", timeout=60)
            # A sleep begun within a second of a wake request counts as begun before it (the
            # requests' resolution, policy/sleep.py): the engine would be woken again as soon as
            # the model is back to Auto, before the next path's request.
            time.sleep(2 * REQUEST_RESOLUTION_SECONDS)
    floor = statistics.median(seconds["direct"])
    return {
        name: {
            "seconds": [round(s, 3) for s in values],
            "p50_s": round(statistics.median(values), 3),
            "max_s": round(max(values), 3),
            "added_over_direct_p50_s": round(statistics.median(values) - floor, 3),
        }
        for name, values in seconds.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=6.0, help="each path, each setting")
    parser.add_argument("--slices", type=int, default=3, help="turns the paths take in rotation")
    parser.add_argument("--rounds", type=int, default=3, help="wakes measured on each path")
    parser.add_argument("--probe-interval", default="2s", help="the operator's (the chart's)")
    parser.add_argument(
        "--picker-interval", default="2s", help="how often the operator reads the picker's queue"
    )
    args = parser.parse_args()
    with cluster(args.probe_interval, args.picker_interval) as kube:
        assert kube.local is not None and kube.local.runtime is not None
        kube.kubectl("apply", "-f", str(pool_crd()))
        kube.local.runtime.images[PICKER_IMAGE] = picker_image()
        kube.apply([*pool_and_picker(), *engine_and_model("Auto")])
        picker = wait_for("the picker Ready", lambda: kube.ready_pods(NAMESPACE, PICKER),
                          timeout=120)[0]  # fmt: skip
        gateway = wait_for("Snooze's gateway Ready", lambda: kube.ready_pods(
            SYSTEM, "app.kubernetes.io/component=gateway"), timeout=120)[0]  # fmt: skip
        pod = wait_for("the engine Ready (its gate open)",
                       lambda: kube.ready_pods(NAMESPACE, LABEL), timeout=120)[0]  # fmt: skip
        engine_url = f"http://{pod.status.pod_ip}:8000"
        with proxy(f"{picker.status.pod_ip}:9002") as stand_in:
            paths = {
                "picker": stand_in.url,
                "gateway": f"http://{gateway.status.pod_ip}:8080",
                "direct": engine_url,
            }
            # What stands between the client and the engine on each path, its CPU measured.
            between = {
                "picker": {"picker": container_pid(kube, picker),
                           "extproc_proxy": stand_in.popen.pid},
                "gateway": {"gateway": container_pid(kube, gateway)},
                "direct": {},
            }  # fmt: skip
            rows = asyncio.run(throughput(paths, between, args.seconds, args.slices))
            wake = wakes(kube, paths, engine_url, args.rounds)
    print(json.dumps({
        "benchmark": "inference_gateway",
        "engine": {"token_seconds": TOKEN_SECONDS, "max_tokens": MAX_TOKENS,
                   "wake_seconds": WAKE_SECONDS + KV_WAKE_SECONDS},
        "seconds_per_setting": args.seconds,
        "slices": args.slices,
        "probe_interval": args.probe_interval,
        "picker_interval": args.picker_interval,
        "throughput": rows,
        "wake": wake,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
