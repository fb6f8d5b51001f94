"""GPU pools end to end: four models of 30 GiB on one 70 GiB device, at most two awake; a request
for a sleeping one is answered after an idle one sleeps; a busy one is spared; the device is
never over-committed (no start refused for room, no wake out of memory), even when the
operator is stopped in the middle of a swap."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import httpx
import pytest
from builders import gpu_pool
from gateway_fixtures import GatewayThread, gateway
from waits import wait_for

from snooze.sim import EngineConfig, SimulatedEngine
from snooze.sim.device import SimulatedDevice

from .conftest import FAST, Cluster, OperatorThread, _addresses
from .test_gateway import MESSAGES, client
from .test_gateway_traffic import metrics_served

__all__ = ["gateway"]
GIB = 2**30
POOLS = "/apis/snooze.dev/v1alpha1/namespaces/default/gpupools"
PODS = "/api/v1/namespaces/default/pods"
NAMES = ("a", "b", "c", "d")
# The container's own start (image, Python, CUDA) before vLLM checks the device's free memory:
# the time a pool has to make room for a member that starts.
CONTAINER_START_SECONDS = 1.5


class Kubelet:
    """Starts a member's engine some time after its pod appears, and marks the pod Ready once
    the engine has loaded: the part of a node the sandbox does not have."""

    def __init__(self, cluster: Cluster, device: SimulatedDevice) -> None:
        self.cluster = cluster
        self.device = device
        self.engines: dict[str, SimulatedEngine] = {}

    def create(self, name: str, *, pod: str | None = None) -> None:
        """Create a pod of model `name` (`NAME-0` unless `pod` names it), Pending: on no node
        yet, as the API server first has it."""
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": pod or f"{name}-0", "labels": {"app": name}},
            "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.33.0"}]},
        }
        self.cluster.http.post(PODS, json=body).raise_for_status()

    def start(
        self,
        name: str,
        *,
        pod: str | None = None,
        wait: bool = True,
        created: bool = False,
        kind: type[EngineConfig] = EngineConfig,
        **options: Any,
    ) -> SimulatedEngine:
        """Start a pod of model `name` (`NAME-0` unless `pod` names it; `created`: Pending
        already) and its engine: 30 GiB awake and 1 GiB asleep, unless `options`
        (EngineConfig's, or those of `kind`, such as an SGLang server's) say otherwise. Returns
        once it has loaded; with `wait` False at once, its pod marked Ready when it has loaded."""
        pod = pod or f"{name}-0"
        host = next(_addresses)
        if not created:
            self.create(name, pod=pod)
        self.cluster.set_pod_ready(pod, host, ready=False)  # on the node, its IP given
        time.sleep(CONTAINER_START_SECONDS)
        config: dict[str, Any] = {
            "gpu_memory_gib": 10,
            "kv_cache_gib": 19,
            "asleep_memory_gib": 1,
            "sleep_seconds": 0.2,
            "wake_seconds": 0.2,
            "token_seconds": 0.01,
            "start_retry_seconds": 0.2,
            "checksum_seconds_per_gib": 0.001,
        }
        engine = self.cluster.sim.add(
            kind(model=name, host=host, port=8000, device=self.device.name, **(config | options))
        )
        self.engines[name if pod == f"{name}-0" else pod] = engine
        if wait:
            wait_for(f"{pod} loaded", lambda: engine.loaded, timeout=30)
            self.cluster.set_pod_ready(pod, host, ready=True)
        else:
            threading.Thread(
                target=self._ready_once_loaded, args=(pod, engine), daemon=True
            ).start()
        return engine

    def _ready_once_loaded(self, pod: str, engine: SimulatedEngine) -> None:
        deadline = time.monotonic() + 120
        while not engine.loaded and time.monotonic() < deadline:
            time.sleep(0.05)
        # The test may be over, its API client closed, before a refused engine loads.
        if engine.loaded and not self.cluster.http.is_closed:
            with contextlib.suppress(RuntimeError):
                self.cluster.set_pod_ready(pod, engine.config.host, ready=True)


class Watcher:
    """Samples the engines while the test runs: the most awake at once, and the most pinned
    host RAM they held together."""

    def __init__(self, engines: dict[str, SimulatedEngine]) -> None:
        self.engines = engines
        self.most_awake = 0
        self.most_pinned = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            awake = sum(1 for e in list(self.engines.values()) if e.loaded and not e.is_sleeping)
            self.most_awake = max(self.most_awake, awake)
            pinned = sum(e.host_memory_bytes for e in list(self.engines.values()))
            self.most_pinned = max(self.most_pinned, pinned)
            time.sleep(0.005)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def device_and_pool(cluster: Cluster) -> Kubelet:
    """A simulated device of 70 GiB and its GPUPool `gpu-0` (minResidency 1s), no member yet."""
    device = cluster.sim.add_device(name="gpu-0", memory_gib=70)
    cluster.http.post(POOLS, json=gpu_pool(minResidency="1s")).raise_for_status()
    return Kubelet(cluster, device)


@pytest.fixture
def pool(cluster: Cluster) -> Iterator[Kubelet]:
    kubelet = device_and_pool(cluster)
    for name in NAMES:
        cluster.create_model(
            name,
            {
                "selector": {"matchLabels": {"app": name}},
                "idle": {"after": "Never"},  # asleep only when the pool needs the room
                "pool": {"name": "gpu-0", "memory": "30Gi", "asleepMemory": "1Gi"},
                "wake": {"timeout": "30s"},
            },
        )
    yield kubelet


def pool_status(cluster: Cluster, name: str = "gpu-0") -> dict[str, Any]:
    response = cluster.http.get(f"{POOLS}/{name}")
    response.raise_for_status()
    status: dict[str, Any] = response.json().get("status") or {}
    return status


def ask(gw: GatewayThread, model: str, tokens: int = 2) -> str:
    reply = client(gw).chat.completions.create(model=model, messages=MESSAGES, max_tokens=tokens)
    return reply.choices[0].message.content or ""


def ask_engine(engine: SimulatedEngine) -> None:
    """A request straight to the engine, past the gateway."""
    body = {"model": engine.config.model, "messages": MESSAGES, "max_tokens": 1}
    httpx.post(f"{engine.url}/v1/chat/completions", json=body, timeout=30).raise_for_status()


def patch_pool(cluster: Cluster, spec: dict[str, Any]) -> None:
    """Change the pool's spec as `kubectl patch --type merge` would."""
    cluster.http.patch(
        f"{POOLS}/gpu-0",
        json={"spec": spec},
        headers={"Content-Type": "application/merge-patch+json"},
    ).raise_for_status()


def two_awake(kubelet: Kubelet) -> list[str]:
    """Once the pool has settled: the names of its two awake members, sorted."""
    awake: list[str] = wait_for(
        "two awake",
        lambda: (
            (a := sorted(n for n, e in kubelet.engines.items() if not e.is_sleeping))
            and len(a) == 2
            and a
        ),
    )
    return awake


def wake_ooms(kubelet: Kubelet) -> int:
    return sum(e.memory.oom_total["wake"] for e in kubelet.engines.values())


def start_refusals(kubelet: Kubelet) -> int:
    return sum(e.memory.oom_total["start"] for e in kubelet.engines.values())


def test_four_models_share_a_gpu_two_at_a_time(
    cluster: Cluster, pool: Kubelet, operator: OperatorThread, gateway: GatewayThread
) -> None:
    watcher = Watcher(pool.engines)
    try:
        for name in NAMES:  # each starts once the pool has made room for it
            pool.start(name)
        wait_for("two asleep", lambda: sum(e.is_sleeping for e in pool.engines.values()) == 2)
        status = wait_for("the pool's status", lambda: (s := pool_status(cluster)) and s)
        assert status["evictions"] >= 2
        assert start_refusals(pool) == 0

        # A request for each sleeping model: answered, after an idle one sleeps for it.
        for name in [n for n, e in pool.engines.items() if e.is_sleeping]:
            assert ask(gateway, name) == "lorem ipsum"
            assert not pool.engines[name].is_sleeping
        assert wake_ooms(pool) == 0
        assert watcher.most_awake <= 2
    finally:
        watcher.stop()
    metrics = operator.metrics
    assert metrics.pool_oom.labels("default", "gpu-0")._value.get() == 0
    assert metrics.pool_evictions.labels("default", "gpu-0", "wake")._value.get() >= 2


def test_the_busy_member_is_spared_and_the_idle_one_sleeps(
    cluster: Cluster, pool: Kubelet, operator: OperatorThread, gateway: GatewayThread
) -> None:
    for name in NAMES:
        pool.start(name)
    busy, idle = two_awake(pool)
    asleep = next(n for n, e in pool.engines.items() if e.is_sleeping)
    with ThreadPoolExecutor(2) as threads:
        stream = threads.submit(ask, gateway, busy, 400)  # 4 s of tokens
        wait_for("the busy one answering", lambda: pool.engines[busy].running > 0)
        assert threads.submit(ask, gateway, asleep).result(30) == "lorem ipsum"
        assert stream.result(30)
    assert pool.engines[idle].is_sleeping
    assert not pool.engines[busy].is_sleeping
    assert pool.engines[busy].sleep_calls == 0
    assert wake_ooms(pool) == 0


def test_cheapest_keeps_the_member_asked_for_most_over_the_one_asked_for_last(
    cluster: Cluster, pool: Kubelet, operator: OperatorThread, gateway: GatewayThread
) -> None:
    patch_pool(cluster, {"eviction": "Cheapest"})
    for name in NAMES:
        pool.start(name)
    popular, once = two_awake(pool)
    asleep = next(n for n, e in pool.engines.items() if e.is_sleeping)
    # A burst for one model, then a single request for the other: the popular one is now the
    # least recently used, and LeastRecentlyUsed would put it to sleep for the next wake.
    with ThreadPoolExecutor(8) as threads:
        answers = list(threads.map(lambda _: ask(gateway, popular, 1), range(200)))
    assert all(answers)
    ask(gateway, once, 1)
    # The operator sees both at its next probes (0.1 s apart here): by then the popular one
    # has been idle a little longer, and asked for 200 times in the last ten minutes.
    # A sleep, not a wait: the probes that see both (0.1 s apart) leave no mark to wait for.
    time.sleep(3.0)
    before = Counter(e["message"].split()[0] for e in cluster.events("MakingRoom"))
    assert ask(gateway, asleep) == "lorem ipsum"
    assert pool.engines[once].is_sleeping
    assert not pool.engines[popular].is_sleeping
    made_room = Counter(e["message"].split()[0] for e in cluster.events("MakingRoom"))
    assert made_room - before == Counter({f"{once}-0": 1})  # the pool's Event names whom
    assert wake_ooms(pool) == 0


def test_a_wake_waits_while_every_member_is_busy_and_says_so(
    cluster: Cluster, pool: Kubelet, operator: OperatorThread, gateway: GatewayThread
) -> None:
    for name in NAMES:
        pool.start(name)
    wait_for("two asleep", lambda: sum(e.is_sleeping for e in pool.engines.values()) == 2)
    awake = [n for n, e in pool.engines.items() if not e.is_sleeping]
    asleep = next(n for n, e in pool.engines.items() if e.is_sleeping)
    with ThreadPoolExecutor(3) as threads:
        streams = [threads.submit(ask, gateway, n, 300) for n in awake]
        wait_for("both busy", lambda: all(pool.engines[n].running for n in awake))
        held = threads.submit(ask, gateway, asleep)
        # (It may first try a member whose last probe was older than its stream, and find
        # it busy when it comes to put it to sleep.)
        waiting = wait_for(
            "WaitingForRoom, every member busy",
            lambda: (
                (c := cluster.condition(asleep, "WaitingForRoom"))
                and c["status"] == "True"
                and "busy" in c["message"]
                and c
            ),
        )
        assert "GPUPool gpu-0" in waiting["message"]
        # A held stream is told what it waits for: room on the pool, not just a wake.
        with httpx.stream(
            "POST",
            gateway.url + "/v1/chat/completions",
            json={"model": asleep, "messages": MESSAGES, "max_tokens": 2, "stream": True},
            timeout=30,
        ) as streamed:
            lines = [line for line in streamed.iter_lines() if line]
        assert any(
            ln.startswith(f": {asleep}: waiting for") and "GPUPool gpu-0" in ln for ln in lines
        ), lines
        assert lines[-1] == "data: [DONE]"
        assert held.result(30) == "lorem ipsum"  # served once a stream ended
        # Neither stream was cut short: each got all its tokens.
        assert [len(s.result(30).split()) for s in streams] == [300, 300]
    assert wake_ooms(pool) == 0
    # Every sleep here made room (idle.after is Never), and only sleeps count as evictions: a
    # member chosen on an old probe and found busy was spared, and is not counted.
    slept = sum(
        e.op_durations["sleep"].count for e in pool.engines.values() if "sleep" in e.op_durations
    )
    counted = operator.metrics.pool_evictions.labels("default", "gpu-0", "wake")._value.get()
    counted += operator.metrics.pool_evictions.labels("default", "gpu-0", "start")._value.get()
    assert counted == slept
    wait_for("the status counts them too", lambda: pool_status(cluster).get("evictions") == slept)
    # One MakingRoom Event for each sleep, none for a member chosen and then spared.
    wait_for("one Event per sleep", lambda: len(cluster.events("MakingRoom")) == slept)


def test_the_operator_stopped_mid_swap_converges_without_overcommitting(
    cluster: Cluster, pool: Kubelet, gateway: GatewayThread
) -> None:
    first = OperatorThread(FAST).start()
    watcher = Watcher(pool.engines)
    try:
        for name in NAMES:
            pool.start(name)
        wait_for("two asleep", lambda: sum(e.is_sleeping for e in pool.engines.values()) == 2)
        asleep = next(n for n, e in pool.engines.items() if e.is_sleeping)
        with ThreadPoolExecutor(1) as threads:
            answer = threads.submit(ask, gateway, asleep)
            wait_for("a swap under way", lambda: pool_status(cluster).get("waiting", 0) > 0)
            first.stop()
            second = OperatorThread(FAST).start()
            try:
                assert answer.result(30) == "lorem ipsum"
            finally:
                second.stop()
        assert watcher.most_awake <= 2
        assert wake_ooms(pool) == 0
    finally:
        watcher.stop()
        if first.error is None:
            first.stop()


def test_headroom_sleeps_an_idle_member_ahead_of_the_next_wake(
    cluster: Cluster, pool: Kubelet, operator: OperatorThread, gateway: GatewayThread
) -> None:
    watcher = Watcher(pool.engines)
    try:
        for name in NAMES:
            pool.start(name)
        wait_for("two asleep", lambda: sum(e.is_sleeping for e in pool.engines.values()) == 2)
        # From now on sleeps are slow (as vLLM's level-1 sleep is, seconds) and wakes fast: a
        # wake that has to wait for another member's sleep is plain to see in its wait.
        sleep_seconds = 3.0
        for engine in pool.engines.values():
            engine.config = replace(engine.config, sleep_seconds=sleep_seconds)
        # The user turns headroom on: the least recently used idle member sleeps, unasked.
        patch_pool(cluster, {"headroom": {"wakes": 1, "idleAfter": "1s"}})
        wait_for("three asleep", lambda: sum(e.is_sleeping for e in pool.engines.values()) == 3)
        events = wait_for("its Event", lambda: cluster.events("MakingRoom"))
        assert any("keep room free for the next wake (headroom)" in e["message"] for e in events)
        headroom = operator.metrics.pool_evictions.labels("default", "gpu-0", "headroom")
        assert headroom._value.get() == 1

        # A request for a sleeping model finds room at once: its wake waits for no sleep.
        asleep = next(n for n, e in pool.engines.items() if e.is_sleeping)
        assert ask(gateway, asleep) == "lorem ipsum"
        [waited] = [w for w in operator.metrics.pool_waits if w.model == asleep]
        assert waited.seconds < sleep_seconds, waited
        # Then the pool is full again, and the other idle member sleeps for the next wake.
        wait_for("room again", lambda: headroom._value.get() == 2, timeout=30)
        wait_for(
            "three asleep again",
            lambda: sum(e.is_sleeping for e in pool.engines.values()) == 3,
        )
        assert not pool.engines[asleep].is_sleeping  # the one just woken stays
        assert watcher.most_awake <= 2
        assert wake_ooms(pool) == 0 and start_refusals(pool) == 0
    finally:
        watcher.stop()


def test_prime_pins_each_member_ahead_of_need_and_wakes_it_back(
    cluster: Cluster, pool: Kubelet, operator: OperatorThread, gateway: GatewayThread
) -> None:
    """An engine's first level-1 sleep pins host RAM and is slow; its later ones reuse it. With
    prime on, each idle member that never slept does that first sleep while nobody waits, one
    at a time, and is woken back at once: a later request for a sleeping model then waits for
    a fast sleep only."""
    watcher = Watcher(pool.engines)
    try:
        for name in ("a", "b", "c"):  # the third starts once one of the first two slept
            pool.start(name)
        first_sleeper = wait_for(
            "one asleep",
            lambda: next((n for n, e in pool.engines.items() if e.is_sleeping), None),
        )
        unpinned = sorted(n for n, e in pool.engines.items() if not e.host_memory_bytes)
        assert len(unpinned) == 2 and first_sleeper not in unpinned
        sleep_seconds = 3.0  # a first sleep, pinning; the later ones take 0.14 of it
        for engine in pool.engines.values():
            engine.config = replace(engine.config, sleep_seconds=sleep_seconds)

        patch_pool(cluster, {"prime": {"idleAfter": "1s"}})
        wait_for(
            "both primed and awake again",
            lambda: all(
                pool.engines[n].host_memory_bytes and not pool.engines[n].is_sleeping
                for n in unpinned
            ),
            timeout=60,
        )
        primes = operator.metrics.pool_evictions.labels("default", "gpu-0", "prime")
        assert primes._value.get() == 2
        making_room = [e["message"] for e in cluster.events("MakingRoom")]
        assert sum("(prime)" in m for m in making_room) == 2, making_room
        # Published (and told) once its answer is checked, a moment after the engine woke.
        wait_for(
            "both woken back",
            lambda: sum("the pool's prime" in e["message"] for e in cluster.events("Woke")) == 2,
        )
        assert pool.engines[first_sleeper].is_sleeping  # untouched: its copy was pinned

        # A request for the sleeping model: an awake member makes room with a fast sleep.
        assert ask(gateway, first_sleeper) == "lorem ipsum"
        [waited] = [w for w in operator.metrics.pool_waits if w.model == first_sleeper]
        assert waited.seconds < sleep_seconds, waited
        assert primes._value.get() == 2  # nothing primed twice
        assert watcher.most_awake <= 2
        assert wake_ooms(pool) == 0 and start_refusals(pool) == 0
    finally:
        watcher.stop()


def test_headroom_never_takes_a_member_serving_traffic_the_operator_did_not_route(
    cluster: Cluster, pool: Kubelet
) -> None:
    # No gateway counters reach this operator (as when clients call the engines directly, or
    # the operator runs without --gateway-service), and its drift interval is the default:
    # an awake engine is probed near its idle deadline only (never, with idle.after Never).
    # A pool member must still be followed: the pool puts to sleep whoever looks idle.
    operator = OperatorThread(replace(FAST, drift_interval=60.0)).start()
    stop = threading.Event()
    try:
        for name in NAMES:
            pool.start(name)
        steady, quiet = two_awake(pool)
        ask_engine(pool.engines[steady])  # seen by a probe, then nothing more for a while
        # A sleep: the steady one's last use is a second older than the quiet one's.
        time.sleep(1.0)
        ask_engine(pool.engines[quiet])  # the quiet one was used last, as far as anyone saw
        # A sleep: a probe sees the quiet one's use before headroom is asked for.
        time.sleep(1.0)

        def traffic() -> None:
            while not stop.is_set():
                ask_engine(pool.engines[steady])
                time.sleep(0.2)

        with ThreadPoolExecutor(1) as threads:
            serving = threads.submit(traffic)
            # A sleep: the steady one serves for a second before headroom is asked for.
            time.sleep(1.0)
            patch_pool(cluster, {"headroom": {"wakes": 1, "idleAfter": "1s"}})
            wait_for("one of them asleep", lambda: pool.engines[quiet].is_sleeping, timeout=15)
            # A sleep: proves the steady one, still serving, stays awake for a second more.
            time.sleep(1.0)
            stop.set()
            serving.result(30)
        assert pool.engines[steady].sleep_calls == 0
        assert not pool.engines[steady].is_sleeping
    finally:
        stop.set()
        operator.stop()


def test_a_pool_that_cannot_fit_its_members_says_why(
    cluster: Cluster, operator: OperatorThread
) -> None:
    cluster.http.post(POOLS, json=gpu_pool("tiny", "20Gi")).raise_for_status()
    cluster.create_pod("x-0", labels={"app": "x", "snooze.dev/pool": "tiny"})
    cluster.create_model(
        "x", {"selector": {"matchLabels": {"app": "x"}}, "pool": {"name": "tiny", "memory": "30Gi"}}
    )
    condition = wait_for(
        "Overcommitted",
        lambda: next(
            (
                c
                for c in pool_status(cluster, "tiny").get("conditions") or []
                if c["type"] == "Overcommitted" and c["status"] == "True"
            ),
            None,
        ),
    )
    assert "> 21474836480 bytes" in condition["message"]


def test_host_memory_counts_the_copies_engines_keep_after_waking(
    cluster: Cluster, pool: Kubelet, operator: OperatorThread, gateway: GatewayThread
) -> None:
    """hostMemory holds two engines' weights (10 GiB each). An engine that slept at level 1
    and woke keeps its pinned copy (PyTorch caches it until the process ends): after two
    swaps at level 1, the third member put to sleep must sleep at level 2, or the engines
    would pin 30 GiB of the 20 allowed."""
    patch_pool(cluster, {"hostMemory": "20Gi"})
    for name in ("a", "b", "c"):
        cluster.patch_model(name, {"spec": {"pool": {"weightsMemory": "10Gi"}}})
    watcher = Watcher(pool.engines)
    try:
        for name in ("a", "b", "c"):  # the third starts once one of the first two slept
            pool.start(name, reload_seconds=0.2)
        first = next(n for n, e in pool.engines.items() if e.is_sleeping)
        assert pool.engines[first].sleep_level == 1
        assert ask(gateway, first) == "lorem ipsum"  # a second member sleeps, at level 1
        second = next(n for n, e in pool.engines.items() if e.is_sleeping)
        assert pool.engines[second].sleep_level == 1
        # Both copies are pinned now, the woken engine's included: 20 GiB of 20.
        assert wait_for("the status", lambda: pool_status(cluster)["hostUsedBytes"] == 20 * GIB)
        third = next(n for n in ("a", "b", "c") if n not in (first, second))
        assert pool.engines[third].host_memory_bytes == 0  # it never slept
        # `first` used last: the next wake puts `third` to sleep, which has no copy to reuse.
        assert ask(gateway, first) == "lorem ipsum"
        assert ask(gateway, second) == "lorem ipsum"
        assert pool.engines[third].is_sleeping
        assert pool.engines[third].sleep_level == 2
        # And its wake, from level 2 (weights reloaded), is granted as any other; `first`
        # makes room for it at level 1 again, reusing its copy.
        assert ask(gateway, third) == "lorem ipsum"
        assert pool.engines[first].is_sleeping and pool.engines[first].sleep_level == 1
    finally:
        watcher.stop()
    assert watcher.most_pinned <= 20 * GIB, watcher.most_pinned / GIB
    assert wake_ooms(pool) == 0
    members = {m["pod"]: m for m in pool_status(cluster)["members"]}
    held = {n: e.host_memory_bytes for n, e in pool.engines.items()}
    assert {p[:-2]: m["hostBytes"] for p, m in members.items()} == held


def test_a_restarted_operator_still_counts_the_copies_engines_keep(
    cluster: Cluster, pool: Kubelet, gateway: GatewayThread
) -> None:
    """A woken engine's copy is known from the pool's status alone once the operator restarts
    (as the API stores it, undeclared fields pruned): the new operator still counts it in
    hostMemory, and the member with no copy sleeps at level 2.

    Which awake member makes room is set by priority, not by which was used last: a restarted
    operator counts every engine's activity as recent as its predecessor's last status write
    could have left unsaid (operator/memory.py's `rebuild`), so all tie, and its first probes
    decide; the member with no copy is put first."""
    patch_pool(cluster, {"hostMemory": "20Gi"})
    for name in ("a", "b", "c"):
        cluster.patch_model(name, {"spec": {"pool": {"weightsMemory": "10Gi"}}})
    watcher = Watcher(pool.engines)
    before = OperatorThread(FAST).start()
    try:
        for name in ("a", "b", "c"):
            pool.start(name, reload_seconds=0.2)
        first = next(n for n, e in pool.engines.items() if e.is_sleeping)
        assert ask(gateway, first) == "lorem ipsum"  # a second member sleeps, at level 1
        second = next(n for n, e in pool.engines.items() if e.is_sleeping)
        assert wait_for("the status", lambda: pool_status(cluster)["hostUsedBytes"] == 20 * GIB)
    finally:
        before.stop()
    third = next(n for n in ("a", "b", "c") if n not in (first, second))
    cluster.patch_model(third, {"spec": {"pool": {"priority": -1}}})
    after = OperatorThread(FAST).start()
    try:
        assert pool.engines[third].host_memory_bytes == 0  # it never slept
        assert ask(gateway, first) == "lorem ipsum"
        assert ask(gateway, second) == "lorem ipsum"
        states = {n: (e.is_sleeping, e.sleep_level) for n, e in pool.engines.items()}
        assert states[third] == (True, 2), (third, states)

        def members() -> dict[str, dict[str, Any]]:
            return {m["pod"][:-2]: m for m in pool_status(cluster)["members"]}

        # The new operator's status (not the one left before the restart): both copies
        # pinned, the woken `first`'s too.
        wait_for("the status", lambda: members()[third]["state"] == "asleep")
        assert pool_status(cluster)["hostUsedBytes"] == 20 * GIB
        assert members()[first]["hostCopy"] and members()[second]["hostCopy"]
    finally:
        after.stop()
        watcher.stop()
    assert watcher.most_pinned <= 20 * GIB, watcher.most_pinned / GIB
    assert wake_ooms(pool) == 0


def test_a_member_seen_pending_gets_room_as_soon_as_it_is_on_its_node(
    cluster: Cluster, pool: Kubelet
) -> None:
    """A pod is created Pending and put on its node later. The pool leaves a Pending pod out
    (it holds nothing on the device yet) and must hear at once that it has come, not one probe
    interval (100 s here) later: its engine is refused at start until room is made."""
    operator = OperatorThread(replace(FAST, probe_interval=100, drift_interval=200)).start()
    try:
        pool.start("a")
        pool.start("b")
        pool.create("c")
        wait_for(
            "the operator to find c-0, Pending",
            lambda: any(e["involvedObject"]["name"] == "c" for e in cluster.events("PodsFound")),
        )
        time.sleep(0.5)  # its pool has looked, and left it out
        pool.start("c", created=True)  # loads within 30 s, or fails
        assert sum(1 for e in pool.engines.values() if e.is_sleeping) == 1
        assert wake_ooms(pool) == 0
    finally:
        operator.stop()


def test_a_wake_waiting_for_busy_members_takes_the_first_one_to_finish(
    cluster: Cluster, pool: Kubelet, gateway: GatewayThread, caplog: pytest.LogCaptureFixture
) -> None:
    """The operator reads the gateway's counters once per probe interval (100 s here), ten
    times as often while a wake waits for busy members (every 10 s), and at once when the
    gateway says an engine's last request ended (its /idle). The member whose stream ends
    first (1 s) is put to sleep while the other still streams (6 s, less than those 10 s),
    and the request is served then."""
    # What the pool chose and when, shown if this fails.
    caplog.set_level(logging.INFO, logger="snooze.operator")
    with metrics_served(gateway.g.metrics) as url:
        settings = replace(FAST, probe_interval=100, drift_interval=200, gateway_metrics=(url,))
        operator = OperatorThread(settings).start()
        try:
            for name in NAMES:
                pool.start(name)
            long_member, short_member = two_awake(pool)
            asleep = next(n for n, e in pool.engines.items() if e.is_sleeping)
            with ThreadPoolExecutor(3) as threads:
                long_stream = threads.submit(ask, gateway, long_member, 600)  # 6 s of tokens
                short_stream = threads.submit(ask, gateway, short_member, 100)  # 1 s
                members = (long_member, short_member)
                wait_for("both busy", lambda: all(pool.engines[n].running for n in members))
                held = threads.submit(ask, gateway, asleep)
                assert held.result(30) == "lorem ipsum"
                assert not long_stream.done(), "served only once the longer stream ended"
                assert len(short_stream.result(30).split()) == 100
                assert len(long_stream.result(30).split()) == 600  # never cut short
            assert pool.engines[short_member].is_sleeping
            assert pool.engines[long_member].sleep_calls == 0
            assert wake_ooms(pool) == 0
        finally:
            operator.stop()
