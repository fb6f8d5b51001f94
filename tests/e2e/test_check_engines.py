"""`snooze check --engine` as a user runs it, a process of its own, against simulated engines of
every release the simulator speaks, with and without --cycle, against engines without dev mode,
busy ones, ones whose pod says they run with LoRA and tensor parallelism, and hostile ones;
asserting on what it printed, its exit status, and what each engine saw."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest
from check_hostile import (
    Hostile,
    endless,
    garbage,
    hostile_servers,  # noqa: F401 (the fixture `hostile`)
    vllm_then_nothing,
)
from check_runs import CYCLED, FAST, check, release_modes
from waits import wait_for

from snooze.sim import EngineConfig, SimulatedEngine, SimulatorHost

from .conftest import Cluster, next_address

# sim/contract.py and sim/serverinfo.py hold the vLLM releases where the contract changes.
RELEASES = release_modes("contract.py", "serverinfo.py", oldest=(0, 8, 0))


def engine(sim: SimulatorHost, **options: Any) -> SimulatedEngine:
    return sim.add(EngineConfig(model="m", host=next_address(), port=8000, **{**FAST, **options}))


def expected(version: str) -> dict[str, str]:
    """What each check says of a simulated engine of this release, cycled at level 1."""
    release = tuple(int(p) for p in version.split("."))
    # Without --pod: known from /server_info's JSON (0.11.0+) to run without LoRA or
    # parallelism, so no row applies; before, a warning: level 2 cannot wake before 0.10.2,
    # and LoRA's rows are not ruled out.
    bugs = "ok" if release >= (0, 11) else "warning"
    return {
        "engine": "ok",
        "dev-mode": "ok",
        "sleep-mode": "ok",  # from /server_info, or proven by the cycle
        "known-bugs": bugs,
        "weight-checker": "ok",
        "metrics": "ok",
        **CYCLED,
    }


def test_every_release_mode_is_checked() -> None:
    assert RELEASES[0] == "0.8.0" and "0.8.3" in RELEASES and "0.11.0" in RELEASES
    assert len(RELEASES) >= 15, RELEASES


def test_every_release_the_simulator_speaks_checks_and_cycles(sim: SimulatorHost) -> None:
    engines = {version: engine(sim, vllm_version=version) for version in RELEASES}
    args = [arg for e in engines.values() for arg in ("--engine", e.url)]
    run = check(*args, "--cycle")
    assert run.code == 0, run.out + run.err
    lines = run.lines()
    for version, sim_engine in engines.items():
        found = {c: level for (subject, c), level in lines.items() if sim_engine.url in subject}
        assert found == expected(version), (version, run.out)
        # One sleep and one wake, as the cycle says: nothing else touched its state.
        assert sim_engine.seen["POST /sleep"] == 1 and not sim_engine.is_sleeping
    assert "vLLM 0.8.0 answers" in run.out and "vLLM 0.33.0 answers" in run.out


@pytest.mark.parametrize("version", ["0.10.2", "0.11.1", "0.27.0", "0.33.0"])
def test_a_level_2_cycle_reloads_and_checks_the_weights(sim: SimulatorHost, version: str) -> None:
    sim_engine = engine(sim, vllm_version=version)
    run = check("--engine", sim_engine.url, "--cycle", "--level", "2")
    assert run.code == 0, run.out
    assert "slept at level 2" in run.line("cycle-sleep")
    assert sim_engine.seen["POST /collective_rpc"] == 1  # the weights were reloaded
    assert "answered as before its sleep" in run.line("cycle-output")


@pytest.mark.parametrize("version", ["0.8.0", "0.8.3", "0.10.1"])
def test_a_level_2_cycle_where_the_release_cannot_reload_sleeps_at_level_1(
    sim: SimulatorHost, version: str
) -> None:
    """Before 0.10.2 no release can reload the weights a level-2 sleep discards: the operator
    sleeps such an engine at level 1 instead, and so does the cycle, saying why."""
    sim_engine = engine(sim, vllm_version=version)
    run = check("--engine", sim_engine.url, "--cycle", "--level", "2")
    assert run.code == 0, run.out
    slept = run.line("cycle-sleep")
    assert slept.startswith("  warning") and "slept at level 1" in slept
    assert "sleep level 2 needs vLLM 0.10.2 or later" in slept
    assert "sleep level 2 needs vLLM 0.10.2 or later" in run.line("known-bugs")
    assert sim_engine.seen["POST /collective_rpc"] == 0
    assert "answered as before its sleep" in run.line("cycle-output")


def test_an_engine_without_dev_mode_fails_by_name_and_is_not_cycled(sim: SimulatorHost) -> None:
    sim_engine = engine(sim, dev_mode=False)
    run = check("--engine", sim_engine.url, "--cycle")
    assert run.code == 1
    dev = run.line("dev-mode")
    assert "FAILURE" in dev and "without VLLM_SERVER_DEV_MODE=1" in dev
    assert "Fix: set the environment variable VLLM_SERVER_DEV_MODE=1" in dev
    assert "not run" in run.line("cycle-sleep")
    assert sim_engine.seen["POST /sleep"] == 0


def test_the_cycle_refuses_a_busy_engine_unless_forced(sim: SimulatorHost) -> None:
    sim_engine = engine(sim, token_seconds=0.05)
    body = {"model": "m", "prompt": "hi", "max_tokens": 60}
    finished: list[int] = []

    def ask() -> None:
        answer = httpx.post(f"{sim_engine.url}/v1/completions", json=body, timeout=60)
        finished.append(answer.status_code)

    thread = threading.Thread(target=ask)
    thread.start()
    wait_for("a request running", lambda: sim_engine.running >= 1, timeout=10)
    refused = check("--engine", sim_engine.url, "--cycle")
    assert refused.code == 1
    assert "not run: the engine is serving 1 request(s)" in refused.line("cycle-sleep")
    assert sim_engine.seen["POST /sleep"] == 0
    forced = check("--engine", sim_engine.url, "--cycle", "--force")
    thread.join(60)
    assert forced.code == 0, forced.out
    assert finished == [200]  # /sleep?mode=wait let it finish
    assert sim_engine.seen["POST /sleep"] == 1


def test_the_pods_arguments_decide_the_known_bugs(sim: SimulatorHost, cluster: Cluster) -> None:
    """vLLM 0.27.1 with LoRA at tensor parallel 2: both levels break (lora-tp-level1 and
    lora-level2), so the operator would keep it awake, and the cycle does not sleep it."""
    sim_engine = cluster.create_pod(
        "lora-0",
        labels={"app": "lora"},
        args=["serve", "m", "--enable-lora", "-tp", "2", "--enable-sleep-mode"],
        vllm_version="0.27.1",
        tensor_parallel_size=2,
    )
    run = check("--engine", sim_engine.url, "--pod", "default/lora-0", "--cycle")
    assert run.code == 1, run.out
    assert "tensor parallel 2, pipeline parallel 1, LoRA on, --enable-sleep-mode" in run.line(
        "serve-args"
    )
    bugs = run.line("known-bugs")
    assert "FAILURE" in bugs and "lora-tp-level1" in bugs and "lora-level2" in bugs
    assert "not run: not at level 1 as asked: Snooze stays awake" in run.line("cycle-sleep")
    assert sim_engine.seen["POST /sleep"] == 0
    missing = check("--engine", sim_engine.url, "--pod", "default/gone")
    assert "FAILURE" in missing.line("serve-args") and "gone" in missing.line("serve-args")


def test_hostile_engines_give_failure_lines_within_the_timeout(hostile: Hostile) -> None:
    silent = hostile.silent(next_address())
    huge = hostile.serve(next_address(), endless)
    junk = hostile.serve(next_address(), garbage)
    stalls = hostile.serve(next_address(), vllm_then_nothing)
    urls = [silent, huge, junk, stalls]
    run = check(*(a for url in urls for a in ("--engine", url)), "--timeout", "1s", "--cycle")
    assert run.code == 1 and "Traceback" not in run.err, run.err
    # Side by side, each request bounded: about one timeout each for the silent engine and
    # for the engine that stalls after /version, not one per request.
    assert run.seconds < 20, run.seconds
    lines = run.lines()
    assert lines[(f"Engine {silent}", "engine")] == "failure"
    assert lines[(f"Engine {huge}", "engine")] == "failure"
    assert lines[(f"Engine {junk}", "engine")] == "failure"
    assert "more than 64 KiB" in run.out
    stalled = {c: level for (s, c), level in lines.items() if s == f"Engine {stalls}"}
    assert stalled["engine"] == "ok"
    assert stalled["dev-mode"] == stalled["metrics"] == "failure"
    assert stalled["cycle-sleep"] == "failure"  # not run: dev mode is not known to work
    # Asked each route once, no retries (/metrics/, which filters: the check's read and the
    # operator's own probe; /metrics: the whole page), and never /sleep.
    assert hostile.asked(stalls) == {
        "GET /version": 1,
        "GET /is_sleeping": 1,
        "GET /server_info": 1,
        "POST /weight_checker": 1,
        "GET /metrics/": 2,
        "GET /metrics": 1,
    }
    assert all("\x1b" not in line for line in run.out.splitlines())
