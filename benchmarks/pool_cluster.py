"""The pools benchmark's cluster: GPUPools, pooled and baseline models, their pods, and the
simulated engines behind them, started as a kubelet would; all delays divided by a time scale."""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import yaml
from harness import NS, ROOT, Bench, loopback
from pool_trace import Request, TraceShape, forced_waits, generate

from snooze.api.durations import parse_duration
from snooze.sim import EngineConfig, SimulatedEngine, SimulatorHost

PODS = f"/api/v1/namespaces/{NS}/pods"
MODELS = f"/apis/snooze.dev/v1alpha1/namespaces/{NS}/inferencemodels"
POOLS = f"/apis/snooze.dev/v1alpha1/namespaces/{NS}/gpupools"
STATE = "snooze.dev/state"
# vLLM's published figures: a level-1 sleep of an engine freeing about 39 GiB (5.7 s; an
# engine's first, which pins its host RAM: later ones take --pinning-share less), and its wake
# (0.28 s: here the weights back from host RAM, then the KV cache).
SLEEP_SECONDS = 5.7
# A level-2 sleep copies nothing, only unmaps: 0.31 s for 47 GiB (vLLM PR #48337, A100).
LEVEL2_SLEEP_SECONDS = 0.3
WAKE_SECONDS = 0.25
KV_WAKE_SECONDS = 0.05
TOKEN_SECONDS = 0.02
# A vLLM container's own start (image, Python, CUDA) before it checks the device's free memory.
CONTAINER_START_SECONDS = 20.0
WEIGHTS_GIB = 16
ASLEEP_GIB = 1
PROBE_INTERVAL = 10.0  # the operator's default
DRIFT_INTERVAL = 60.0  # the same


def address(kind: int, index: int) -> str:
    """The loopback address of a pooled (kind 0) or baseline (kind 1) engine, under the octet
    this process claims (harness.loopback)."""
    return loopback(kind, index + 2)


def footprints(models: int) -> list[int]:
    """Each engine's awake footprint in GiB, 30 to 38: two of them and two residues fit 80."""
    return [30 + round(8 * i / max(models - 1, 1)) for i in range(models)]


LIMIT = 2 * (WAKE_SECONDS + KV_WAKE_SECONDS) + 1
"""The target's bound on a request's added latency: twice the engine's wake plus one second."""


def percentiles(values: list[float], scale: float = 1.0) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p99": None, "max": None}
    ordered = sorted(v * scale for v in values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {
        "p50": round(statistics.median(ordered), 3),
        "p99": round(p99, 3),
        "max": round(ordered[-1], 3),
    }


def trace_for(args: argparse.Namespace, seed: int) -> list[Request]:
    """The trace the benchmarks' flags describe."""
    shape = TraceShape(
        models=args.models,
        seconds=60 * args.minutes,
        zipf=args.zipf,
        bursts_per_hour=args.bursts_per_hour,
        burst_seconds=args.burst_seconds,
        request_gap=args.request_gap,
    )
    return generate(shape, seed)


def pool_fits(args: argparse.Namespace) -> Callable[[frozenset[int]], bool]:
    """Whether a set of models of one pool fits awake together, its other members asleep."""
    sizes = footprints(args.models)
    pools: int = args.pools
    memory: int = args.pool_gib
    members = [[m for m in range(args.models) if m % pools == p] for p in range(pools)]

    def fits(active: frozenset[int]) -> bool:
        pool = members[next(iter(active)) % pools]
        return sum(sizes[m] if m in active else ASLEEP_GIB for m in pool) <= memory

    return fits


def forced_over_limit(requests: list[Request], args: argparse.Namespace) -> int:
    """The trace's lower bound on the requests over LIMIT (pool_trace.forced_waits), with the
    benchmark's engines: the members sleep at level 1 (no hostMemory), at best a later sleep
    that reuses its pinned RAM."""
    return forced_waits(
        requests,
        pools=args.pools,
        fits=pool_fits(args),
        token_seconds=TOKEN_SECONDS,
        wake_seconds=WAKE_SECONDS + KV_WAKE_SECONDS,
        bound=LIMIT,
        sleep_seconds=SLEEP_SECONDS * (1 - args.pinning_share),
    )


class Scaled:
    """Trace seconds to wall seconds, and to the durations the specs carry."""

    def __init__(self, factor: float) -> None:
        self.factor = factor

    def wall(self, seconds: float) -> float:
        return seconds / self.factor

    def duration(self, text: str) -> str:
        if text == "Never":
            return text
        return f"{max(1, round(1000 * parse_duration(text) / self.factor))}ms"


class Cluster:
    """The sandbox's pods, models and pools, and the engines behind them: what the kubelet and
    a device plugin would do, done by hand."""

    def __init__(self, setup: Bench, sim: SimulatorHost, args: argparse.Namespace) -> None:
        self.setup = setup
        self.api = setup.api
        self.sim = sim
        self.args = args
        self.time = Scaled(args.time_scale)
        self.pooled: dict[str, SimulatedEngine] = {}
        self.baseline: dict[str, SimulatedEngine] = {}
        self.pool_of: dict[str, str] = {}

    def apply_crds(self) -> None:
        for path in sorted((ROOT / "crds").glob("*.yaml")):
            crd = yaml.safe_load(path.read_text())
            response = self.api.post(
                "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd
            )
            response.raise_for_status()

    def engine_config(self, name: str, host: str, footprint: int, device: str | None) -> Any:
        t = self.time.wall
        return EngineConfig(
            model=name,
            host=host,
            port=8000,
            device=device,
            gpu_memory_gib=WEIGHTS_GIB,
            kv_cache_gib=footprint - WEIGHTS_GIB - ASLEEP_GIB,
            asleep_memory_gib=ASLEEP_GIB,
            sleep_seconds=t(SLEEP_SECONDS),
            pinning_share=self.args.pinning_share,
            level2_sleep_seconds=t(LEVEL2_SLEEP_SECONDS),
            wake_seconds=t(WAKE_SECONDS),
            kv_wake_seconds=t(KV_WAKE_SECONDS),
            reload_seconds=t(20.0),
            token_seconds=t(TOKEN_SECONDS),
            start_retry_seconds=t(1.0),
            max_concurrency=64,
            # Left out, as in the rows before it: the weights' digests taken at an engine's
            # first idle sleep (benchmarks/verify.py measures them). A pool's sleeps to make
            # room never take them.
            checksum_seconds_per_gib=0.0,
        )

    def pod(self, name: str, host: str, *, ready: bool) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"{name}-0", "labels": {"app": name}},
            "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.33.0"}]},
        }
        self.api.post(PODS, json=body).raise_for_status()
        self.ready(name, host, ready=ready)

    def ready(self, name: str, host: str, *, ready: bool) -> None:
        status = {
            "phase": "Running",
            "podIP": host,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        }
        self.api.patch(
            f"{PODS}/{name}-0/status",
            json={"status": status},
            headers={"Content-Type": "application/merge-patch+json"},
        ).raise_for_status()

    def model(self, name: str, spec: dict[str, Any]) -> None:
        body = {
            "apiVersion": "snooze.dev/v1alpha1",
            "kind": "InferenceModel",
            "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": {"app": name}}, **spec},
        }
        self.api.post(MODELS, json=body).raise_for_status()

    def create(self) -> None:
        args, d = self.args, self.time.duration
        self.apply_crds()
        sizes = footprints(args.models)
        for p in range(args.pools):
            self.sim.add_device(name=f"gpu-{p}", memory_gib=args.pool_gib)
            spec: dict[str, Any] = {"memory": f"{args.pool_gib}Gi"}
            spec["minResidency"] = d(args.min_residency)
            spec["eviction"] = args.eviction
            if args.headroom:
                spec["headroom"] = {"wakes": 1, "idleAfter": d(args.headroom)}
            if args.prime:
                spec["prime"] = {"idleAfter": d(args.prime)}
            body = {"apiVersion": "snooze.dev/v1alpha1", "kind": "GPUPool"}
            self.api.post(POOLS, json={**body, "metadata": {"name": f"gpu-{p}"}, "spec": spec})
        for i in range(args.models):
            # Rank i is the i-th most requested; pools take ranks in turn, so each gets a mix.
            name, pool = f"m{i}", f"gpu-{i % args.pools}"
            self.pool_of[name] = pool
            memory = {"memory": f"{sizes[i]}Gi", "asleepMemory": f"{ASLEEP_GIB}Gi"}
            self.model(
                name,
                {
                    "idle": {"after": d(args.idle_after)},
                    "pool": {"name": pool, **memory},
                    "wake": {"timeout": d("2m")},
                },
            )
            base = f"base{i}"
            host = address(1, i)
            self.baseline[base] = self.sim.add(self.engine_config(base, host, sizes[i], None))
            self.pod(base, host, ready=True)
            self.model(base, {"desiredState": "Awake"})

    def start_members(self) -> None:
        """As a kubelet would: a member's pod first (not Ready), its engine once the container
        has started (it is refused and retries while its device lacks room), Ready once loaded.
        Members of one pool start one after another; pools in parallel."""
        sizes = footprints(self.args.models)

        def one_pool(pool: str) -> None:
            for i, name in enumerate(self.pool_of):
                if self.pool_of[name] != pool:
                    continue
                host = address(0, i)
                self.pod(name, host, ready=False)
                time.sleep(self.time.wall(CONTAINER_START_SECONDS))
                engine = self.sim.add(self.engine_config(name, host, sizes[i], pool))
                self.pooled[name] = engine
                deadline = time.monotonic() + 120
                while not engine.loaded:
                    if time.monotonic() > deadline:
                        raise SystemExit(f"pools: {name} did not load in 120 s: {engine}")
                    time.sleep(0.02)
                self.ready(name, host, ready=True)

        threads = [
            threading.Thread(target=one_pool, args=(p,)) for p in sorted(set(self.pool_of.values()))
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def labels(self) -> dict[str, str | None]:
        pods = self.api.get(PODS).json()["items"]
        return {
            p["metadata"]["name"][:-2]: (p["metadata"].get("labels") or {}).get(STATE) for p in pods
        }

    def settled(self) -> bool:
        """Every engine loaded and labelled awake or asleep, and no wake waits for room."""
        labels = self.labels()
        if any(labels.get(name) != "awake" for name in self.baseline):
            return False
        if any(labels.get(name) not in ("awake", "asleep") for name in self.pool_of):
            return False
        pools = self.api.get(POOLS).json()["items"]
        return all((p.get("status") or {}).get("waiting") == 0 for p in pools)

    def state_of(self, name: str) -> str:
        engine = self.pooled[name]
        if engine.ops_in_flight.get("sleep"):
            return "sleeping"
        if engine.ops_in_flight.get("wake"):
            return "waking"
        if not engine.is_sleeping:
            return "awake"
        need = engine.memory.footprint_bytes - engine.memory.residue_bytes
        return "asleep-room" if engine.device.free_bytes >= need else "asleep-full"

    def counters(self) -> dict[str, int]:
        """The pooled engines' refused allocations so far, and (from the operator's Events)
        their sleeps and wakes: a swap is a sleep to make room (MakeRoom)."""
        engines = list(self.pooled.values())
        counts = {
            "wake_ooms": sum(e.memory.oom_total["wake"] for e in engines),
            "start_refusals": sum(e.memory.oom_total["start"] for e in engines),
            "swaps": 0,
            "idle_sleeps": 0,
            "other_sleeps": 0,
            "wakes": 0,
            "failed_sleeps_or_wakes": 0,
        }
        for event in self.api.get(f"/api/v1/namespaces/{NS}/events").json()["items"]:
            if event["involvedObject"]["name"] not in self.pool_of:
                continue
            reason, message = event.get("reason"), event.get("message") or ""
            number = int(event.get("count") or 1)
            if reason == "Slept":
                kind = (
                    "swaps"
                    if "(MakeRoom)" in message
                    else "idle_sleeps"
                    if "idle.after" in message
                    else "other_sleeps"
                )
                counts[kind] += number
            elif reason == "Woke":
                counts["wakes"] += number
            elif reason in ("SleepFailed", "WakeFailed"):
                counts["failed_sleeps_or_wakes"] += number
        return counts
