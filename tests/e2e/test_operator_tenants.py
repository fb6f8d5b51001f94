"""Fair to every tenant, against the real operator process: a tenant whose models flap (each
asked to wake every two seconds, idle.after 1s, so asleep again before the next request)
stays within its namespace's write budget, counted by the sandbox over a window, and another
tenant's wakes keep their pace (a control taken in the same test). The wakes' turns are
benchmarks/hostile.py's (--scene tenants) and tests/unit/test_kube_writes.py's."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from waits import wait_for

from snooze.sandbox import Sandbox

from .conftest import Cluster, next_address
from .test_hostile_engines import Hostiles, Operator, calm_rounds, start_calm

INTERVAL = 1.0
BUDGET = 0.5  # writes per probe interval per model: 30 a minute
BURST = BUDGET * 30  # per model (operator/settings.py WRITE_BURST_INTERVALS)
FLAPPING = 8
ASK_EVERY = 2.0  # longer than idle.after and a sleep: each request finds the model asleep
WINDOW = 20.0


class Tenant:
    """Models in a namespace of their own, each asked to wake every second."""

    def __init__(self, cluster: Cluster, hostiles: Hostiles, count: int) -> None:
        self.cluster = Cluster(cluster.sandbox, cluster.sim, namespace="flap")
        self.names = [f"flap-{i}" for i in range(count)]
        for name in self.names:
            host = hostiles.serve(next_address(), kind="honest")
            self.cluster.add_pod(f"{name}-0", labels={"app": name}, ip=host)
            self.cluster.create_model(
                name, {"selector": {"matchLabels": {"app": name}}, "idle": {"after": "1s"}}
            )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._ask, daemon=True)

    def _ask(self) -> None:
        while not self._stop.wait(ASK_EVERY):
            for name in self.names:
                self.cluster.request_wake(name, at=time.time())

    def labelled(self) -> bool:
        return all(self.cluster.pod_state(f"{n}-0") is not None for n in self.names)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.cluster.close()


@pytest.fixture
def hostiles(tmp_path: Path) -> Iterator[Hostiles]:
    engines = Hostiles(tmp_path / "hostile.log")
    yield engines
    engines.stop()


def flap_writes(sandbox: Sandbox) -> int:
    """Writes to the flapping tenant's namespace so far, as the sandbox answered them."""
    return sandbox.writes_count("flap")


def test_a_flapping_tenant_stays_within_its_budget_and_another_keeps_its_pace(
    cluster: Cluster, hostiles: Hostiles, tmp_path: Path
) -> None:
    operator = Operator(tmp_path, "--write-budget", str(BUDGET))
    try:
        start_calm(cluster)
        control = calm_rounds(cluster, 2)
        tenant = Tenant(cluster, hostiles, FLAPPING)
        wait_for("the tenant's pods labelled", tenant.labelled, timeout=60)
        tenant.start()
        try:
            # Past its bursts: from here on, its budget's rate is what it may write.
            wait_for(
                "the bursts spent",
                lambda: flap_writes(cluster.sandbox) >= FLAPPING * BURST * 1.5,
                timeout=120,
            )
            before, began = flap_writes(cluster.sandbox), time.monotonic()
            during = calm_rounds(cluster, 2)
            wait_for("the window", lambda: time.monotonic() - began >= WINDOW, timeout=WINDOW)
            written = flap_writes(cluster.sandbox) - before
            seconds = time.monotonic() - began
        finally:
            tenant.stop()
    finally:
        operator.stop()

    rate = BUDGET / INTERVAL  # per model, per second
    # Its writes, its wakes' included, stay within its budget over the window, and two bursts
    # (one it may have saved, one of debt its wakes' writes may take it into): 400 here, where
    # with no budget it wrote 712.
    assert written <= FLAPPING * (rate * seconds + 2 * BURST), (written, seconds)
    # The other tenant's wakes keep their pace: within twice the control's, give or take an
    # interval (its own cycle).
    assert statistics.median(during[0]) <= 2 * statistics.median(control[0]) + INTERVAL, (
        during[0],
        control[0],
    )
