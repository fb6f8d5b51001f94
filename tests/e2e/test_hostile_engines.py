"""Hostile engines against the real operator process: a `/metrics` answer of 300 MB (and a
gateway replica's page as large), a hundred answers that drip a byte at a time, and values no
engine can have. The operator's memory stays near its own baseline, another model's wakes and
sleeps keep the pace they had before the hostile ones came (a baseline taken in the same
test), and each hostile model's status says why its engines count as not answering. The
hostile engines run in a process of their own (benchmarks/hostile_engines.py) and tell what
they were asked and how much of their answers the operator took."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from ports import free_port
from processes import Process
from waits import wait_for

from snooze.engine.exposition import Labels
from snooze.operator.settings import Settings

from .conftest import Cluster, next_address

ROOT = Path(__file__).resolve().parents[2]
HOSTILE_ENGINES = ROOT / "benchmarks" / "hostile_engines.py"
INTERVAL = 0.5
IDLE_AFTER = 1.0
CALM = {"app": "calm"}
PROBE_TIMEOUT = Settings().probe_timeout  # the operator's, as `snooze operator` runs it
MIB = 1 << 20
GAUGES = "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"
AWAKE = 'vllm:engine_sleep_state{sleep_state="awake"} 1\n'


class Hostiles:
    """The hostile engines' process (benchmarks/hostile_engines.py) and its control port."""

    def __init__(self, log: Path) -> None:
        port = free_port()
        self.control = f"http://127.0.0.1:{port}/engines"
        with log.open("wb") as out:
            self.popen = subprocess.Popen(
                [sys.executable, str(HOSTILE_ENGINES), "--control-port", str(port)],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        wait_for("the hostile engines", self._up, timeout=30)

    def _up(self) -> bool:
        try:
            return httpx.get(self.control).status_code == 200
        except httpx.HTTPError:
            return False

    def serve(self, host: str, **behaviour: Any) -> str:
        httpx.post(self.control, json={"host": host, **behaviour}).raise_for_status()
        return host

    def seen(self, host: str) -> dict[str, Any]:
        report: dict[str, Any] = httpx.get(self.control).json()[host]
        return report

    def stop(self) -> None:
        self.popen.terminate()
        self.popen.wait(10)


class Operator:
    """`snooze operator` as a process: its log, its metrics page, its memory."""

    def __init__(self, tmp_path: Path, *extra: str) -> None:
        port = free_port()
        self.metrics = f"http://127.0.0.1:{port}/metrics"
        args = ["--probe-interval", str(INTERVAL), "--metrics-port", str(port), *extra]
        self.process = Process(tmp_path / "operator.log", "operator", *args)
        self.pid = self.process.popen.pid

    def memory_kib(self) -> tuple[int, int]:
        """Resident memory now, and its peak since the last reset_peak (VmRSS, VmHWM)."""
        found = {}
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            found[key] = value
        return int(found["VmRSS"].split()[0]), int(found["VmHWM"].split()[0])

    def reset_peak(self) -> None:
        Path(f"/proc/{self.pid}/clear_refs").write_text("5")  # VmHWM back to VmRSS

    def count(self, name: str, **labels: str) -> float:
        """The sum of a metric's samples whose labels include `labels`, from its page."""
        total = 0.0
        for line in httpx.get(self.metrics).text.splitlines():
            if line.startswith(name + "{"):
                text, value = line[len(name) + 1 :].rsplit("} ", 1)
                if all(Labels(text.encode()).get(k) == v for k, v in labels.items()):
                    total += float(value)
        return total

    def log(self) -> str:
        return self.process.output()

    def stop(self) -> None:
        assert self.process.stop() == 0, self.log()[-3000:]


@pytest.fixture
def hostiles(tmp_path: Path) -> Iterator[Hostiles]:
    engines = Hostiles(tmp_path / "hostile.log")
    yield engines
    engines.stop()


def pod_entry(cluster: Cluster, model: str, pod: str) -> dict[str, Any]:
    for entry in cluster.status(model).get("pods") or []:
        if entry.get("name") == pod:
            return dict(entry)
    return {}


def calm_rounds(cluster: Cluster, rounds: int) -> tuple[list[float], list[float]]:
    """Wake the calm model and let it fall asleep again, `rounds` times: how long each wake
    took (the request to its status saying awake, which the gateway waits for), and how long
    after idle.after each sleep came."""
    wakes, lates = [], []

    def state_is(state: str) -> float | None:
        return (
            time.monotonic() if pod_entry(cluster, "calm", "calm-0").get("state") == state else None
        )

    wait_for("calm asleep", lambda: state_is("asleep"), timeout=60)
    for _ in range(rounds):
        began = time.monotonic()
        cluster.request_wake("calm")
        awake = wait_for("calm awake", lambda: state_is("awake"), timeout=60)
        wakes.append(awake - began)
        asleep = wait_for("calm asleep", lambda: state_is("asleep"), timeout=60)
        lates.append(asleep - awake - IDLE_AFTER)
    return wakes, lates


def assert_same_pace(
    base: tuple[list[float], list[float]], hostile: tuple[list[float], ...]
) -> None:
    """The calm model's wakes and sleeps with hostile engines about: no slower than three times
    its slowest before them, give or take one probe interval (a cycle of the operator's own)."""
    for what, before, after in zip(("wake", "sleep delay"), base, hostile, strict=True):
        bound = 3 * max(max(before), 0.0) + INTERVAL
        assert max(after) <= bound, f"{what}: {after} against {before} before the hostile engines"


def start_calm(cluster: Cluster) -> None:
    cluster.create_pod("calm-0", labels=CALM)
    cluster.create_model("calm", {"selector": {"matchLabels": CALM}, "idle": {"after": "1s"}})


def hostile_model(cluster: Cluster, name: str, hosts: list[str]) -> None:
    labels = {"app": name}
    for i, host in enumerate(hosts):
        cluster.add_pod(f"{name}-{i}", labels=labels, ip=host)
    cluster.create_model(name, {"selector": {"matchLabels": labels}, "idle": {"after": "1h"}})


def test_a_huge_page_costs_neither_memory_nor_another_models_time(
    cluster: Cluster, hostiles: Hostiles, tmp_path: Path
) -> None:
    # A gateway replica whose page turns huge too: the operator reads it every interval.
    replica = hostiles.serve(next_address(), kind="page", text="")
    operator = Operator(tmp_path, "--gateway-metrics", f"http://{replica}:8000/metrics")
    try:
        start_calm(cluster)
        base = calm_rounds(cluster, 2)
        rss, _ = operator.memory_kib()
        operator.reset_peak()

        huge = hostiles.serve(next_address(), kind="huge", bytes=300 * 1_000_000)
        hostiles.serve(replica, kind="huge", bytes=300 * 1_000_000)
        hostile_model(cluster, "huge", [huge])
        during = calm_rounds(cluster, 2)
        entry = wait_for(
            "the huge engine unreachable",
            lambda: (e := pod_entry(cluster, "huge", "huge-0")).get("state") == "unreachable" and e,
            timeout=60,
        )
        _, peak = operator.memory_kib()
        failures = operator.count(
            "snooze_probe_failures_total", model="huge", reason="AnswerTooLarge"
        )
        scrapes = operator.count("snooze_gateway_scrape_failures_total", reason="AnswerTooLarge")
    finally:
        operator.stop()

    assert_same_pace(base, during)
    # Before the bound, one such page took the operator from 73 MiB to 1,261 MiB.
    assert peak < rss + 64 * 1024, f"peak {peak} kB against {rss} kB before the huge pages"
    assert "more than 8 MiB" in entry["message"] and huge in entry["message"]
    assert failures >= 2
    assert scrapes >= 1
    # The engine saw each answer cut short: far less than its 300 MB taken each time.
    seen = hostiles.seen(huge)
    assert seen["requests"]["/metrics"] >= 2
    assert seen["sent"] / seen["requests"]["/metrics"] < 64 * MIB
    # Told once, as one Event's line, not at every probe; and no traceback.
    log = operator.log()
    assert log.count("huge-0: no usable answer") == 1, log[-3000:]
    assert "Traceback" not in log
    assert log.count(f"gateway replica http://{replica}:8000/metrics cannot be used") == 1


def test_engines_that_drip_their_answers_delay_no_other_model(
    cluster: Cluster, hostiles: Hostiles, tmp_path: Path
) -> None:
    operator = Operator(tmp_path)
    try:
        start_calm(cluster)
        base = calm_rounds(cluster, 2)
        # More than the operator's 64 probes at once, each dripping a byte every 0.1 s.
        drips = [hostiles.serve(next_address(), kind="drip", interval=0.1) for _ in range(100)]
        hostile_model(cluster, "drip", drips)
        during = calm_rounds(cluster, 3)
        entry = wait_for(
            "the dripping engines unreachable",
            lambda: (e := pod_entry(cluster, "drip", "drip-0")).get("state") == "unreachable" and e,
            timeout=90,
        )
        failures = operator.count("snooze_probe_failures_total", model="drip", reason="Timeout")
    finally:
        operator.stop()

    assert_same_pace(base, during)
    assert f"took longer than {PROBE_TIMEOUT:g}s answering /metrics" in entry["message"]
    assert failures >= len(drips)
    # A deadline for the whole answer, not for each byte: no drip kept the operator longer.
    longest = max(hostiles.seen(host)["longest"] for host in drips)
    assert longest <= PROBE_TIMEOUT + INTERVAL


BAD_PAGES = {
    # The finding: +Inf here raised OverflowError, the model's loop failed at every cycle and
    # its pod was never labelled.
    "inf": ("vllm:num_requests_running +Inf\nvllm:num_requests_waiting 0\n" + AWAKE, "is +Inf"),
    "nan": ("vllm:num_requests_running 0\nvllm:num_requests_waiting NaN\n" + AWAKE, "is NaN"),
    "negative": (GAUGES.replace("running 0", "running -3") + AWAKE, "is -3"),
    "huge-count": (GAUGES.replace("running 0", "running 1e9") + AWAKE, "is 1e+09"),
    "counter": (GAUGES + AWAKE + "vllm:request_success_total 1e300\n", "is 1e+300"),
    "twice": (GAUGES + 'vllm:num_requests_running{engine="0"} 1\n' * 2 + AWAKE, "twice"),
    "state": (GAUGES + 'vllm:engine_sleep_state{sleep_state="awake"} 7\n', "is 7"),
    "long-line": (GAUGES + AWAKE + f'vllm:cache_config_info{{x="{"y" * 70_000}"}} 1\n', "64 KiB"),
}


def test_values_no_engine_can_have_are_a_failed_probe_with_its_reason(
    cluster: Cluster, hostiles: Hostiles, tmp_path: Path
) -> None:
    operator = Operator(tmp_path)
    hosts = {}
    try:
        for name, (page, _) in BAD_PAGES.items():
            hosts[name] = hostiles.serve(next_address(), kind="page", text=page)
            hostile_model(cluster, name, [hosts[name]])
        entries = {
            name: wait_for(
                f"{name} unreachable",
                lambda n=name: (
                    (e := pod_entry(cluster, n, f"{n}-0")).get("state") == "unreachable" and e
                ),
                timeout=60,
            )
            for name in BAD_PAGES
        }
        # Healed, it is believed again: labelled awake, as the engine says.
        hostiles.serve(hosts["inf"], kind="page", text=GAUGES + AWAKE)
        wait_for("inf labelled awake", lambda: cluster.pod_state("inf-0") == "awake", timeout=30)
        failures = {
            name: operator.count("snooze_probe_failures_total", model=name, reason="InvalidAnswer")
            for name in BAD_PAGES
        }
        errors = operator.count("snooze_reconcile_errors_total")
    finally:
        operator.stop()

    for name, (_, why) in BAD_PAGES.items():
        assert why in entries[name]["message"], (name, entries[name])
        assert hosts[name] in entries[name]["message"]
        assert failures[name] >= 2
        assert hostiles.seen(hosts[name])["requests"]["/metrics"] >= 2
        assert cluster.pod_state(f"{name}-0") is None or name == "inf"  # never labelled on it
    assert errors == 0  # no cycle failed
    assert "Traceback" not in operator.log()
