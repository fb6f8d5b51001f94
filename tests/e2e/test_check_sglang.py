"""`snooze check --engine URL` against simulated SGLang servers, run as a user runs it: every
release mode the SGLang simulator has, with and without --enable-weights-cpu-backup, told apart
from vLLM, checked and cycled; and the servers Snooze must not sleep (no memory saver, keys,
busy, paused already), asserting on what it printed, its exit status, its JSON and what each
server saw."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest
from check_hostile import (
    Hostile,
    hostile_servers,  # noqa: F401 (the fixture `hostile`)
    login_wall,
    sglang_then_nothing,
    sglang_without_end,
)
from check_runs import CYCLED, FAST, check, release_modes
from waits import wait_for

from snooze.api.agreed import RELEASED_ANNOTATION
from snooze.sim import EngineConfig, SimulatorHost
from snooze.sim.sglang.contract import OLDEST_SGLANG
from snooze.sim.sglang.engine import SGLangConfig, SGLangEngine

from .conftest import Cluster, next_address

ADMIN_ROUTES = (
    "POST /pause_generation",
    "POST /release_memory_occupation",
    "POST /resume_memory_occupation",
    "POST /continue_generation",
)


RELEASES = release_modes("sglang/contract.py", oldest=OLDEST_SGLANG)


def server(sim: SimulatorHost, **options: Any) -> SGLangEngine:
    found = sim.add(SGLangConfig(model="m", host=next_address(), port=30000, **FAST, **options))
    assert isinstance(found, SGLangEngine)
    return found


def release(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def test_every_sglang_release_mode_is_checked() -> None:
    assert RELEASES[0] == "0.4.9" and "0.5.3" in RELEASES and "0.5.12" in RELEASES
    assert len(RELEASES) >= 10, RELEASES


@pytest.mark.parametrize("backup", [True, False], ids=["cpu-backup", "no-cpu-backup"])
def test_every_sglang_release_checks_and_cycles(sim: SimulatorHost, backup: bool) -> None:
    servers = {v: server(sim, sglang_version=v, weights_cpu_backup=backup) for v in RELEASES}
    args = [arg for s in servers.values() for arg in ("--engine", s.url)]
    run = check(*args, "--cycle", "--output", "json", timeout=300)
    assert run.code == 0, run.out
    document = run.document()
    assert document["passed"] is True
    by_server: dict[str, dict[str, dict[str, Any]]] = {}
    for entry in document["checks"]:
        by_server.setdefault(entry["subject"]["name"], {})[entry["check"]] = entry
    for version, found in servers.items():
        checks = by_server[found.url]
        level = 1 if backup and release(version) >= (0, 5, 3) else 2
        bugs = "warning" if version == "0.5.5" else "ok"  # sglang-abort-pause-then-assert
        expected = {
            "engine": "ok",
            "api-keys": "ok",
            "memory-saver": "ok",
            "cpu-backup": "ok",
            "known-bugs": bugs,
            "weight-checker": "ok",
            "metrics": "ok",
            **CYCLED,
        }
        assert {c: e["level"] for c, e in checks.items()} == expected, (version, checks)
        assert checks["engine"]["data"] == {"version": version, "kind": "sglang"}
        assert checks["cpu-backup"]["data"] == {"level": level}
        assert checks["cycle-sleep"]["data"]["level"] == level
        assert checks["cycle-wake"]["data"]["wake_seconds"] >= 0
        weights = checks["cycle-weights"]["message"]
        if release(version) >= (0, 5, 12):
            assert "match their digests before its sleep" in weights, (version, weights)
        else:
            assert "not compared: no weight checker" in weights, (version, weights)
        if version == "0.5.5":
            assert checks["known-bugs"]["data"]["bugs"] == ["sglang-abort-pause-then-assert"]
        # What the server saw: one pause, one release of every tag, resumed, continued; at
        # level 2 the weights read again; it never died.
        assert found.calls.get("release_memory_occupation") == 1, (version, found.calls)
        assert found.calls.get("pause_generation") == 1
        reloads = found.seen["POST /update_weights_from_disk"]
        assert reloads == (1 if level == 2 else 0), (version, reloads)
        assert not found.released and found.death is None, version


def test_vllm_and_sglang_side_by_side_are_told_apart(sim: SimulatorHost) -> None:
    vllm = sim.add(EngineConfig(model="m", host=next_address(), port=8000, **FAST))
    sglang = server(sim)
    run = check("--engine", vllm.url, "--engine", sglang.url)
    assert run.code == 0, run.out
    lines = run.lines()
    assert "vLLM 0.33.0 answers" in run.out and "SGLang 0.5.23 answers (/server_info)" in run.out
    assert lines[(f"Engine {vllm.url}", "dev-mode")] == "ok"
    assert lines[(f"Engine {sglang.url}", "memory-saver")] == "ok"
    assert (f"Engine {sglang.url}", "dev-mode") not in lines
    assert (f"Engine {vllm.url}", "memory-saver") not in lines
    # Each kind asked what it speaks: the SGLang server was asked /version once, and nothing
    # of vLLM's dev mode.
    assert sglang.seen["GET /version"] == 1 and sglang.seen["GET /is_sleeping"] == 0


def test_an_old_release_is_found_at_get_server_info(sim: SimulatorHost) -> None:
    """Before 0.5.6 there is no /server_info: the check reads /get_server_info."""
    old = server(sim, sglang_version="0.5.3", weights_cpu_backup=True)
    run = check("--engine", old.url)
    assert run.code == 0, run.out
    assert "SGLang 0.5.3 answers (/get_server_info)" in run.line("engine")
    assert "has /weights_checker" not in run.line("weight-checker")
    assert "has no /weights_checker" in run.line("weight-checker")


def test_without_the_memory_saver_it_fails_by_name_and_is_never_released(
    sim: SimulatorHost,
) -> None:
    bare = server(sim, memory_saver=False)
    run = check("--engine", bare.url, "--cycle")
    assert run.code == 1
    saver = run.line("memory-saver")
    assert saver.startswith("  FAILURE") and "without --enable-memory-saver" in saver
    assert "Fix: add --enable-memory-saver" in saver
    assert "not run" in run.line("cycle-sleep") and "memory-saver" in run.line("cycle-sleep")
    assert not any(bare.seen[route] for route in ADMIN_ROUTES), bare.seen


def test_without_metrics_it_fails_and_is_never_released(sim: SimulatorHost) -> None:
    blind = server(sim, metrics=False)
    run = check("--engine", blind.url, "--cycle")
    assert run.code == 1
    metrics = run.line("metrics")
    assert metrics.startswith("  FAILURE") and "Fix: add --enable-metrics" in metrics
    assert not any(blind.seen[route] for route in ADMIN_ROUTES), blind.seen


def test_keys_are_named_never_shown(sim: SimulatorHost) -> None:
    """/server_info prints the keys in clear: the check names the flags and never a key."""
    admin_key, api_key = "admin-secret-7f3a9c", "api-secret-51d2e8"
    admin = server(sim, admin_api_key=admin_key)
    keyed = server(sim, api_key=api_key)
    for output in ("text", "json"):
        run = check("--engine", admin.url, "--engine", keyed.url, "--cycle", "--output", output)
        assert run.code == 1
        assert admin_key not in run.out + run.err and api_key not in run.out + run.err
    text = check("--engine", admin.url, "--engine", keyed.url, "--cycle")
    lines = text.lines()
    assert lines[(f"Engine {admin.url}", "api-keys")] == "failure"
    assert "it runs with --admin-api-key" in text.out
    assert lines[(f"Engine {keyed.url}", "engine")] == "failure"
    assert "wants a key (--api-key)" in text.out
    for found in (admin, keyed):
        assert not any(found.seen[route] for route in ADMIN_ROUTES), found.seen


def test_the_cycle_refuses_a_busy_server_and_force_never_releases_under_a_request(
    sim: SimulatorHost,
) -> None:
    busy = server(sim, token_seconds=0.05)
    body = {"model": "m", "prompt": "hi", "max_tokens": 80}
    answers: list[httpx.Response] = []
    thread = threading.Thread(
        target=lambda: answers.append(
            httpx.post(f"{busy.url}/v1/completions", json=body, timeout=60)
        )
    )
    thread.start()
    wait_for("a request running", lambda: busy.running >= 1, timeout=10)
    refused = check("--engine", busy.url, "--cycle")
    assert refused.code == 1
    assert "not run: the engine is serving 1 request(s)" in refused.line("cycle-sleep")
    assert "Snooze pauses generation" in refused.line("cycle-sleep")
    assert not any(busy.seen[route] for route in ADMIN_ROUTES), busy.seen
    # Forced: paused, found still holding the request, continued; nothing released.
    forced = check("--engine", busy.url, "--cycle", "--force")
    thread.join(60)
    assert forced.code == 1, forced.out
    slept = forced.line("cycle-sleep")
    assert slept.startswith("  FAILURE") and "not released" in slept, slept
    assert busy.seen["POST /pause_generation"] == 1
    assert busy.seen["POST /continue_generation"] == 1
    assert busy.seen["POST /release_memory_occupation"] == 0
    assert [a.status_code for a in answers] == [200]
    assert busy.death is None and not busy.released


def test_a_paused_server_is_not_cycled(sim: SimulatorHost) -> None:
    """From 0.5.20 /ready answers 503 while generation is paused: the server may be released
    already, and a second release kills it."""
    paused = server(sim)
    httpx.post(f"{paused.url}/pause_generation", json={"mode": "retract"}).raise_for_status()
    run = check("--engine", paused.url, "--cycle")
    assert run.code == 1
    assert "not run: /ready answers 503" in run.line("cycle-sleep")
    assert paused.seen["POST /release_memory_occupation"] == 0


def test_a_pod_the_operator_released_is_not_cycled(sim: SimulatorHost, cluster: Cluster) -> None:
    """Before /ready (0.5.20) the operator's annotation on the pod is what says it."""
    config = SGLangConfig(
        model="m", host=next_address(), port=30000, sglang_version="0.5.12", **FAST
    )
    pod_server = cluster.create_pod("sg-0", labels={"app": "sg"}, engine=config)
    assert isinstance(pod_server, SGLangEngine)
    annotations = {RELEASED_ANNOTATION: "0:kv_cache,paused,weights"}
    response = cluster.http.patch(
        f"/api/v1/namespaces/{cluster.ns}/pods/sg-0",
        json={"metadata": {"annotations": annotations}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert response.status_code < 300, response.text
    run = check("--engine", pod_server.url, "--pod", f"{cluster.ns}/sg-0", "--cycle")
    assert run.code == 1, run.out
    assert "snooze.dev/released annotation" in run.line("cycle-sleep")
    assert pod_server.seen["POST /release_memory_occupation"] == 0
    assert "released or paused on it" in run.line("serve-args")
    missing = check("--engine", pod_server.url, "--pod", f"{cluster.ns}/gone")
    assert missing.code == 1 and "gone" in missing.line("serve-args"), missing.out
    assert missing.line("serve-args").startswith("  FAILURE")


def test_a_level_its_flags_do_not_make_is_a_warning(sim: SimulatorHost) -> None:
    """--level 1 on a server without --enable-weights-cpu-backup: it sleeps at level 2, as the
    operator would, and the line says why."""
    dropping = server(sim)
    run = check("--engine", dropping.url, "--cycle", "--level", "1")
    assert run.code == 0, run.out
    slept = run.line("cycle-sleep")
    assert slept.startswith("  warning") and "slept at level 2" in slept
    assert "without --enable-weights-cpu-backup" in slept
    assert dropping.seen["POST /update_weights_from_disk"] == 1


def test_hostile_sglang_servers_give_failure_lines_within_the_timeout(hostile: Hostile) -> None:
    stalls = hostile.serve(next_address(), sglang_then_nothing)
    huge = hostile.serve(next_address(), sglang_without_end)
    run = check("--engine", stalls, "--engine", huge, "--timeout", "1s", "--cycle")
    assert run.code == 1 and "Traceback" not in run.err, run.err
    assert run.seconds < 20, run.seconds
    lines = run.lines()
    stalled = {c: level for (s, c), level in lines.items() if s == f"Engine {stalls}"}
    assert stalled["engine"] == stalled["memory-saver"] == "ok"
    assert stalled["metrics"] == stalled["cycle-sleep"] == "failure"
    assert lines[(f"Engine {huge}", "engine")] == "failure"
    # Asked once each, and never an admin route: the cycle did not run.
    assert not any(path.startswith("POST") for path in hostile.asked(stalls)), hostile.seen
    assert hostile.asked(stalls)["GET /server_info"] == 1


def test_a_login_wall_is_not_taken_for_sglang_wanting_its_key(hostile: Hostile) -> None:
    """SGLang refuses for want of its key in words of its own; a proxy's 401 is neither kind."""
    wall = hostile.serve(next_address(), login_wall)
    run = check("--engine", wall)
    assert run.code == 1 and "Traceback" not in run.err, run.err
    said = run.line("engine")
    assert "neither as vLLM" in said and "wants a key" not in said, said
