"""Run the demo: every part in one process, the scenario's traffic, the live view, the results."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from snooze.api.models import Phase
from snooze.api.modelstatus import parse_status
from snooze.demo import dashboard, picture, pool_summary, replayed, summary, traffic, view
from snooze.demo import scenario as scenarios
from snooze.demo.controller import ReplicaSetStandIn, deployment
from snooze.demo.sampler import Sampler, metric_total, pool_total
from snooze.demo.services import Prometheus, check_port
from snooze.demo.timeline import GIB
from snooze.gateway.embedded import GatewayThread
from snooze.kube.pods import pod_info
from snooze.operator.embedded import OperatorThread
from snooze.operator.metrics import OperatorMetrics
from snooze.operator.settings import Settings

log = logging.getLogger(__name__)
NS = "default"
MODELS = f"/apis/snooze.dev/v1alpha1/namespaces/{NS}/inferencemodels"
POOLS = f"/apis/snooze.dev/v1alpha1/namespaces/{NS}/gpupools"
PODS = f"/api/v1/namespaces/{NS}/pods"
DEPLOYMENTS = f"/apis/apps/v1/namespaces/{NS}/deployments"


@dataclass(frozen=True, kw_only=True)
class Options:
    duration: float = 60.0
    scale: float = 1.0
    out: Path = Path("snooze-demo")
    port: int = 8080
    prometheus: bool = False
    hybrid_crash: bool = True
    seed: int = 0
    log_level: str = "info"
    """Of OUT/demo.log; debug adds every API and engine request."""


def addresses() -> Iterator[str]:
    """Loopback addresses for the pods, one each; the octet keeps side-by-side runs apart."""
    octet = 20 + (os.getpid() + 100) % 200
    n = 0
    while True:
        yield f"127.{octet}.{n // 250}.{n % 250 + 2}"
        n += 1


async def _wait(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep up to `seconds`; True when `stop` was set meanwhile."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), max(0.0, seconds))
    return stop.is_set()


async def _setup(
    api: httpx.AsyncClient, scenario: scenarios.Scenario, crds: list[dict[str, Any]]
) -> None:
    for crd in crds:
        response = await api.post(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd
        )
        response.raise_for_status()
    for pool in scenario.pools:
        body = {
            "apiVersion": "snooze.dev/v1alpha1",
            "kind": "GPUPool",
            "metadata": {"name": pool.name, "namespace": NS},
            "spec": pool.spec,
        }
        (await api.post(POOLS, json=body)).raise_for_status()
    for m in scenario.first_models:
        await _deploy(api, m, model=False)


async def _deploy(api: httpx.AsyncClient, m: scenarios.ModelPlan, *, model: bool) -> None:
    """The model's Deployment, and (`model`) its InferenceModel first: a pool member's pods
    must be known as members before they start, so that the pool makes room for them."""
    if model:
        await _create_model(api, m)
    body = deployment(m.name, replicas=m.replicas, labels={"app": m.name})
    (await api.post(DEPLOYMENTS, json=body)).raise_for_status()


async def _create_model(api: httpx.AsyncClient, m: scenarios.ModelPlan) -> None:
    body = {
        "apiVersion": "snooze.dev/v1alpha1",
        "kind": "InferenceModel",
        "metadata": {"name": m.name, "namespace": NS},
        "spec": m.spec,
    }
    (await api.post(MODELS, json=body)).raise_for_status()


async def _pods_ready(api: httpx.AsyncClient, scenario: scenarios.Scenario) -> bool:
    """Every Deployment made before the traffic has its replicas Running and Ready (the
    engines loaded)."""
    items = (await api.get(PODS)).json().get("items", [])
    ready: dict[str, int] = {}
    for pod in map(pod_info, items):
        if pod.ready:
            app = pod.labels.get("app", "")
            ready[app] = ready.get(app, 0) + 1
    return all(ready.get(m.name, 0) >= m.replicas for m in scenario.first_models)


async def _awake_models(
    api: httpx.AsyncClient, gateway_url: str, scenario: scenarios.Scenario
) -> set[str]:
    """The models that are Awake with all their replicas and that the gateway knows."""
    items = (await api.get(MODELS)).json().get("items", [])
    async with httpx.AsyncClient(base_url=gateway_url, timeout=5) as client:
        listed = {m["id"] for m in (await client.get("/v1/models")).json().get("data", [])}
    awake = set()
    for item in items:
        name, status = item["metadata"]["name"], parse_status(item.get("status"))
        if status.phase is Phase.AWAKE and status.awake == scenario.model(name).replicas:
            awake.add(name)
    return awake & listed


class Demo:
    """One run: start everything, play the scenario, stop everything, report."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.scenario = scenarios.build(
            duration=options.duration,
            scale=options.scale,
            seed=options.seed,
            hybrid_crash=options.hybrid_crash,
        )
        self.metrics = OperatorMetrics()
        self.records: list[traffic.Record] = []
        self.stop = asyncio.Event()
        self.interrupted = False
        self.sampler: Sampler | None = None
        self.elapsed = 0.0
        self.events: list[dict[str, str]] = []
        self.prometheus: Prometheus | None = None
        self.started = 0.0  # the traffic's start, in Unix time: Prometheus' clock
        self.panels: list[dashboard.Panel] = []
        self.pools = {pool.name: pool.members for pool in self.scenario.pools}
        self.device_ooms: dict[str, tuple[int, int]] = {}
        """Per pool: wakes and starts its simulated GPU refused, read before the engines stop."""

    def _interrupt(self) -> None:
        if not self.stop.is_set():
            self.interrupted = True
            print("\nsnooze demo: stopping (the results so far follow)", file=sys.stderr)
        self.stop.set()

    async def run(self) -> int:
        from snooze.api.crd import crd, pool_crd
        from snooze.gateway.settings import GatewaySettings
        from snooze.sandbox import Sandbox
        from snooze.sim import SimulatorHost

        o, sc = self.options, self.scenario
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._interrupt)
        for line in scenarios.describe(sc):
            print(line)
        stack = contextlib.ExitStack()
        closers: list[Any] = []
        try:
            sandbox = stack.enter_context(Sandbox())
            os.environ["KUBECONFIG"] = str(sandbox.write_kubeconfig(o.out / "kubeconfig"))
            sim = stack.enter_context(SimulatorHost())
            for pool in sc.pools:
                sim.add_device(name=pool.name, memory_gib=pool.memory_gib)
            api = httpx.AsyncClient(base_url=sandbox.url, timeout=10)
            closers.append(api.aclose)
            await _setup(api, sc, [crd(), pool_crd()])
            controller = ReplicaSetStandIn(
                url=sandbox.url,
                sim=sim,
                addresses=addresses(),
                namespace=NS,
                per_deployment={m.name: {"model": m.name, **m.engine} for m in sc.models},
                container_start={m.name: m.container_start_seconds for m in sc.models},
                interval=0.1,
            ).start()
            stack.callback(controller.stop)
            settings = Settings(
                probe_interval=scenarios.probe_interval(o.scale),
                drain_timeout=max(1.0, 5.0 * o.scale),
                drain_poll=0.05,
                probe_timeout=2.0,
            )
            operator = OperatorThread(settings, self.metrics).start()
            stack.callback(operator.stop)
            gateway = GatewayThread(
                GatewaySettings(host="127.0.0.1", port=o.port, keepalive_seconds=max(0.2, o.scale))
            ).start()
            stack.callback(gateway.stop)
            gateway_url = f"http://127.0.0.1:{gateway.port}"
            if o.prometheus:
                self._prometheus(stack, gateway)
            print(f"gateway: {gateway_url}/v1 (OpenAI API); loading models ...", flush=True)
            begun = time.monotonic()
            while not await _pods_ready(api, sc):
                await self._setup_wait(begun, "the pods' engines to load")
            for m in sc.first_models:
                await _create_model(api, m)
            # Each model counts once it was seen Awake: the quick ones may sleep meanwhile.
            seen: set[str] = set()
            first = {m.name for m in sc.first_models}
            while not self.stop.is_set() and seen != first:
                seen |= await _awake_models(api, gateway_url, sc) & first
                await self._setup_wait(begun, f"models awake (so far: {sorted(seen)})")
            print(f"all models awake after {time.monotonic() - begun:.1f}s; traffic starts")
            self.sampler = Sampler(
                api=api,
                controller=controller,
                gateway=gateway,
                metrics=self.metrics,
                models=sc.model_names,
                pools=self.pools,
            )
            await self._play(gateway_url, api)
            if self.prometheus is not None:
                await self._query_dashboard(self.prometheus)
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            print("stopping ...", flush=True)
            for close in closers:
                await close()
            # The parts stop in reverse: gateway, operator, controller, engines, API server.
            await asyncio.to_thread(stack.close)
        return self.report()

    async def _setup_wait(self, begun: float, what: str) -> None:
        if await _wait(self.stop, 0.1):
            raise KeyboardInterrupt
        if time.monotonic() - begun > 120:
            raise RuntimeError(f"snooze demo: gave up after 2 minutes waiting for {what}")

    def _prometheus(self, stack: contextlib.ExitStack, gateway: GatewayThread) -> None:
        from prometheus_client import start_http_server

        registries = {"snooze-operator": self.metrics.registry}
        registries["snooze-gateway"] = gateway.metrics.registry
        targets: dict[str, str] = {}
        for job, registry in registries.items():
            server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
            stack.callback(thread.join, 5)
            stack.callback(server.shutdown)
            targets[job] = f"127.0.0.1:{server.server_port}"
        prometheus = Prometheus(targets=targets, out=self.options.out)
        prometheus.start()
        stack.callback(prometheus.stop)
        self.prometheus = prometheus
        print(f"prometheus: {prometheus.url} (scraping {', '.join(targets.values())})")

    async def _play(self, gateway_url: str, api: httpx.AsyncClient) -> None:
        assert self.sampler is not None
        sc = self.scenario
        live = view.LiveView(sc.model_names, pools=self.pools)
        t0 = time.monotonic()
        self.started = time.time()
        sending = asyncio.create_task(
            traffic.run_traffic(
                url=gateway_url, plan=list(sc.traffic), t0=t0, stop=self.stop, records=self.records
            )
        )
        deploying = asyncio.create_task(self._deploy_late(api, t0, live))
        every = max(0.05, 0.2 * sc.scale)
        shown = -1.0
        # The scenario's clock, then a grace for requests still held (a cold start, a restart).
        grace = 30.0 + 30.0 * sc.scale
        while True:
            now = time.monotonic() - t0
            sample = await self.sampler.sample(now)
            if not live.tty or now - shown >= 1.0:
                live.show(sample, self.records)
                shown = now
            over = now >= sc.duration and (sending.done() or now >= sc.duration + grace)
            if over or await _wait(self.stop, every):
                break
        live.release()
        deploying.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await deploying
        self.device_ooms = self._device_ooms()
        if not sending.done():
            # Interrupted or out of grace: give in-flight requests a moment, then cut them.
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(sending), 2.0)
            sending.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sending
        self.elapsed = time.monotonic() - t0
        await self.sampler.sample(self.elapsed)
        items = (await self.sampler.api.get(f"/api/v1/namespaces/{NS}/events")).json()
        # An Event said again is one object with a count (operator/events/correlation.py):
        # listed once per time it was said.
        self.events = [
            {
                "model": (e.get("involvedObject") or {}).get("name", ""),
                "reason": e.get("reason", ""),
                "message": e.get("message", ""),
            }
            for e in items.get("items", [])
            for _ in range(max(1, int(e.get("count") or 1)))
        ]

    async def _deploy_late(self, api: httpx.AsyncClient, t0: float, live: view.LiveView) -> None:
        """The models the scenario deploys while the traffic runs, each at its time."""
        late = sorted(
            (m for m in self.scenario.models if m.deploy_at is not None),
            key=lambda m: m.deploy_at or 0.0,
        )
        for m in late:
            if await _wait(self.stop, t0 + (m.deploy_at or 0.0) - time.monotonic()):
                return
            await _deploy(api, m, model=True)
            live.say(
                f"{time.monotonic() - t0:6.1f}s deployed {m.name} (its InferenceModel and "
                f"Deployment)" + (f" on GPUPool {m.pool}" if m.pool else "")
            )

    def _device_ooms(self) -> dict[str, tuple[int, int]]:
        """Per pool, the wakes and the starts its GPU refused for want of memory, summed over
        every engine that ran on it (the engines' own counts)."""
        assert self.sampler is not None
        found: dict[str, tuple[int, int]] = {}
        engines = self.sampler.controller.every_engine
        for pool in self.pools:
            mine = [e for e in engines if e.config.device == pool]
            found[pool] = (
                sum(e.memory.oom_total["wake"] for e in mine),
                sum(e.memory.oom_total["start"] for e in mine),
            )
        return found

    async def _query_dashboard(self, prometheus: Prometheus) -> None:
        """Every dashboard panel over the run, before Prometheus stops (its last scrapes in)."""
        await asyncio.sleep(2 * prometheus.interval)
        try:
            self.panels = await asyncio.to_thread(
                dashboard.query,
                prometheus.url,
                start=self.started,
                end=time.time(),
                namespace=NS,
                scrape=prometheus.interval,
                scale=self.scenario.scale,
            )
        except (OSError, httpx.HTTPError, KeyError, ValueError) as exc:  # no board, no server
            log.warning("the dashboard's queries failed", exc_info=True)
            print(f"snooze demo: no dashboard: {exc}", file=sys.stderr)

    def _pool_summary(self, pool: scenarios.PoolPlan) -> pool_summary.PoolSummary:
        assert self.sampler is not None
        members = [self.scenario.model(m) for m in pool.members]
        footprint = max(m.engine["gpu_memory_gib"] + m.engine["kv_cache_gib"] for m in members)
        asleep = max(m.engine["asleep_memory_gib"] for m in members)
        most, peak = pool_summary.device_counts(
            self.sampler.timeline, pool.name, pool.members, asleep_bytes=int(asleep * GIB)
        )
        wake_ooms, start_refusals = self.device_ooms.get(pool.name, (0, 0))
        return pool_summary.PoolSummary(
            pool=pool.name,
            members=pool.members,
            memory_gib=pool.memory_gib,
            footprint_gib=footprint + asleep,
            swaps=round(pool_total(self.metrics, "snooze_pool_evictions_total", pool.name, "wake")),
            start_evictions=round(
                pool_total(self.metrics, "snooze_pool_evictions_total", pool.name, "start")
            ),
            wake_waits=tuple(
                w.seconds
                for w in self.metrics.pool_waits
                if (w.namespace, w.pool) == (NS, pool.name)
            ),
            ooms=round(pool_total(self.metrics, "snooze_pool_oom_total", pool.name)),
            device_wake_ooms=wake_ooms,
            device_start_refusals=start_refusals,
            most_awake=most,
            peak_used_gib=peak,
        )

    def report(self) -> int:
        o, sc = self.options, self.scenario
        if self.sampler is None:
            return 130 if self.interrupted else 1
        rows = summary.summarize(
            records=self.records,
            timeline=self.sampler.timeline,
            baselines={m.name: m.replicas for m in sc.models},
            wakes={
                m: round(metric_total(self.metrics, "snooze_wake_duration_seconds_count", m))
                for m in sc.model_names
            },
            restarts={
                m: round(metric_total(self.metrics, "snooze_pod_restarts_total", m))
                for m in sc.model_names
            },
            expected_errors={m.name: m.expected_failures for m in sc.models},
        )
        print()
        for line in summary.table(rows):
            print(line)
        pools = [self._pool_summary(pool) for pool in sc.pools]
        for pool in pools:
            print()
            for line in pool_summary.lines(pool):
                print(line)
        both = replayed.compare(sc, self.records, end=self.elapsed)
        print()
        for line in replayed.lines(*both):
            print(line)
        png = o.out / "timeline.png"
        picture.render_png(
            self.sampler.timeline,
            self.records,
            sc.model_names,
            png,
            title=f"snooze demo: {self.elapsed:.0f}s, time scale x{sc.scale:g}",
            pools=self.pools,
        )
        result = {
            "duration": self.elapsed,
            "scale": sc.scale,
            "interrupted": self.interrupted,
            "models": summary.as_json(rows),
            "pools": [pool_summary.as_json(pool) for pool in pools],
            "replayed": replayed.as_json(*both),
            "swaps": [vars(s) for s in self.sampler.timeline.swaps],
            "wake_durations": self.sampler.timeline.wakes,
            "incidents": [vars(i) for i in self.sampler.timeline.incidents],
            "states": {m: sorted(self.sampler.timeline.states_seen(m)) for m in sc.model_names},
            "requests": [vars(r) for r in self.records],
            "events": self.events,
        }
        (o.out / "summary.json").write_text(json.dumps(result, indent=1))
        print(f"\ntimeline: {png}\nsummary: {o.out / 'summary.json'}; log: {o.out / 'demo.log'}")
        if self.panels:
            board = o.out / "dashboard.png"
            title = (
                "The Grafana dashboard's panels (charts/snooze/dashboards/snooze.json), "
                f"queried from the demo's Prometheus over its {self.elapsed:.0f} s"
            )
            dashboard.render(self.panels, board, end=self.elapsed, title=title)
            print(f"dashboard: {board} (its panels' queries, plotted; counts in dashboard.json)")
        if self.interrupted:
            return 130
        unexpected = sum(max(0, r.errors - r.expected_errors) for r in rows)
        if unexpected:
            print(f"snooze demo: {unexpected} request(s) failed unexpectedly", file=sys.stderr)
            return 1
        return 0


def configure_logging(out: Path, level: str = "info") -> None:
    """Everything the parts log goes to a file: the terminal is the live view's."""
    out.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(out / "demo.log", mode="w")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    if level != "debug":
        for noisy in ("httpx", "httpcore", "kopf.objects", "aiohttp.access"):
            logging.getLogger(noisy).setLevel(logging.WARNING)


def main(options: Options) -> int:
    check_port("127.0.0.1", options.port)
    configure_logging(options.out, options.log_level)
    return asyncio.run(Demo(options).run())
