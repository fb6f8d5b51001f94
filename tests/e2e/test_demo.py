"""`snooze demo` end to end: a compressed run exits 0, answers everything and adds up."""

from __future__ import annotations

import json
import re
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
BOARD = Path(__file__).resolve().parents[2] / "charts" / "snooze" / "dashboards" / "snooze.json"


def demo(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "snooze.cli", "demo", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# One run serves every test (each run takes half a minute), with Prometheus, as a user who
# wants the dashboard runs it.
pytestmark = pytest.mark.needs("prometheus")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path_factory.mktemp("demo")
    result = demo(
        "--prometheus",
        "--duration",
        "20",
        "--time-scale",
        "0.3",
        "--port",
        "0",
        "--out",
        str(out),
    )
    return result, out


@pytest.fixture(scope="module")
def summary(run: tuple[subprocess.CompletedProcess[str], Path]) -> dict[str, Any]:
    result, out = run
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    data: dict[str, Any] = json.loads((out / "summary.json").read_text())
    return data


def test_every_request_is_answered(summary: dict[str, Any]) -> None:
    requests = summary["requests"]
    assert len(requests) > 50
    failed = [r for r in requests if r["status"] != 200 or r["error"] or r["answered"] is None]
    assert failed == []
    assert {r["model"] for r in requests} == {m["model"] for m in summary["models"]}


def test_the_crash_is_remedied(summary: dict[str, Any]) -> None:
    restarted = [e for e in summary["events"] if e["reason"] == "PodRestarted"]
    assert [e["model"] for e in restarted] == ["hybrid-unpatched"]
    assert any(
        e["reason"] == "WakeFailed" and "HybridKVCacheReinit" in e["message"]
        for e in summary["events"]
        if e["model"] == "hybrid-unpatched"
    )
    row = next(m for m in summary["models"] if m["model"] == "hybrid-unpatched")
    assert row["restarts"] == 1
    asked = [r for r in summary["requests"] if r["model"] == "hybrid-unpatched"]
    # Held through the restart: answered by the recreated pod, after it failed to wake.
    assert asked and all(r["status"] == 200 and r["held"] > 0 for r in asked)
    patched = next(m for m in summary["models"] if m["model"] == "hybrid-patched")
    assert patched["wakes"] >= 1 and patched["restarts"] == 0


def test_the_sglang_model_is_released_and_resumed(summary: dict[str, Any]) -> None:
    row = next(m for m in summary["models"] if m["model"] == "qa")
    assert row["wakes"] >= 1 and row["restarts"] == 0 and row["wake_failures"] == 0
    asked = [r for r in summary["requests"] if r["model"] == "qa"]
    assert asked and all(r["status"] == 200 for r in asked)
    assert any(r["held"] > 0 for r in asked)  # held while its server resumed
    assert "asleep" in summary["states"]["qa"]


def test_a_clean_run_ends_cleanly(
    run: tuple[subprocess.CompletedProcess[str], Path], summary: dict[str, Any]
) -> None:
    """No traceback and no task left pending, on the terminal or in the log. The one error
    allowed is a pool member's engine refusing to start for want of free memory (vLLM's
    ValueError), and only when the summary reports it: on a loaded machine the operator may
    react after the container's start."""
    result, out = run
    [pool] = summary["pools"]
    refusal = re.compile(r" ERROR snooze\.sim\.engine: \S+: ValueError: Free memory on device ")
    log = (out / "demo.log").read_text()
    if pool["device_start_refusals"]:
        log = "\n".join(line for line in log.splitlines() if not refusal.search(line))
    for where, text in (("stdout", result.stdout), ("stderr", result.stderr), ("demo.log", log)):
        for sign in ("Traceback", "Task was destroyed", " ERROR "):
            assert sign not in text, f"{sign!r} in {where}:\n{text[-3000:]}"


def test_the_crash_shows_where_a_person_looks(
    run: tuple[subprocess.CompletedProcess[str], Path], summary: dict[str, Any]
) -> None:
    """The failure, its reason and the remedy: in the live view, the timeline, the summary."""
    result, _ = run
    assert "hybrid-unpatched: wake failed (HybridKVCacheReinit)" in result.stdout
    assert "hybrid-unpatched: pod restarted (HybridKVCacheReinit)" in result.stdout
    # The timeline draws the failing pod red, and marks the failure and the restart.
    assert "failed" in summary["states"]["hybrid-unpatched"]
    assert "failed" not in summary["states"]["hybrid-patched"]
    incidents = [(i["model"], i["what"], i["reason"]) for i in summary["incidents"]]
    assert incidents == [
        ("hybrid-unpatched", "wake failed", "HybridKVCacheReinit"),
        ("hybrid-unpatched", "pod restarted", "HybridKVCacheReinit"),
    ]
    row = next(m for m in summary["models"] if m["model"] == "hybrid-unpatched")
    assert row["wake_failures"] == 1 and row["failure_reasons"] == ["HybridKVCacheReinit"]
    assert row["serving_again"] is not None and row["serving_again"] > 0
    # The summary says what happened and what ends it for good.
    [line] = [x for x in result.stdout.splitlines() if x.startswith("hybrid-unpatched: 1 wake")]
    assert "remedy: pod restarted" in line and "images/vllm" in line


def test_the_summary_adds_up(summary: dict[str, Any]) -> None:
    by_model = {m["model"]: m for m in summary["models"]}
    for model, row in by_model.items():
        assert 0.0 <= row["asleep_share"] <= 1.0, model
        # The wakes come from the operator's metric; its Events count them independently.
        events = [
            e
            for e in summary["events"]
            if e["model"] == model and e["reason"] in ("Woke", "ScaledUp")
        ]
        assert row["wakes"] == len(events), model
        assert len(summary["wake_durations"].get(model, [])) == row["wakes"], model
        assert row["requests"] == sum(1 for r in summary["requests"] if r["model"] == model)
    assert by_model["chat"]["asleep_share"] == 0.0
    assert by_model["code"]["wakes"] >= 1
    assert by_model["summarize"]["wakes"] == 1  # the cold start from zero replicas
    assert by_model["summarize"]["asleep_share"] > 0.2


def test_the_timeline_is_drawn(run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    result, out = run
    png = (out / "timeline.png").read_bytes()
    assert png[:8] == PNG_MAGIC
    assert 10_000 < len(png) < 400_000
    width, height = struct.unpack(">II", png[16:24])
    assert 600 <= width <= 2000 and 400 <= height <= 2000
    assert "timeline: " in result.stdout
    assert "wake p50" in result.stdout  # the summary table


def test_the_dashboard_is_plotted_from_prometheus(
    run: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    """With --prometheus, every dashboard panel is queried over the run and drawn."""
    result, tmp_path = run
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    png = (tmp_path / "dashboard.png").read_bytes()
    assert png[:8] == PNG_MAGIC
    assert 20_000 < len(png) < 400_000
    counts = json.loads((tmp_path / "dashboard.json").read_text())["panels"]
    panels = [p["title"] for p in json.loads(BOARD.read_text())["panels"] if p["type"] != "row"]
    assert [p["title"] for p in counts] == panels
    assert [p["title"] for p in counts if p["series"] == 0 or p["points"] == 0] == []
    assert f"dashboard: {tmp_path / 'dashboard.png'}" in result.stdout


def test_the_pool_makes_room_and_the_held_request_is_answered(summary: dict[str, Any]) -> None:
    """Four models of 30 GiB on one simulated GPU of 70 GiB: a request for a sleeping member
    is held while the least recently used awake one sleeps, then answered; never three awake,
    never a wake out of memory."""
    [pool] = summary["pools"]
    members = set(pool["members"])
    assert members == {"translate", "sql", "legal", "support"}
    for_wakes = [s for s in summary["swaps"] if not s["making_room_for"].startswith("starting ")]
    assert for_wakes, summary["swaps"]
    for swap in for_wakes:
        assert swap["model"] in members and swap["making_room_for"] in members - {swap["model"]}
    answered_after_a_swap = [
        r
        for r in summary["requests"]
        for s in for_wakes
        if r["model"] == s["making_room_for"]
        and r["status"] == 200
        and r["held"] > 0
        and r["sent"] <= s["t"] <= r["answered"]
    ]
    assert answered_after_a_swap, "no held request answered after its member's room was made"
    assert pool["most_awake"] == 2  # the simulated GPU's own count, sampled through the run
    assert pool["peak_used_gib"] <= pool["memory_gib"]
    assert pool["ooms"] == pool["device_wake_ooms"] == 0
    assert pool["wake_waits"] and all(w > 0 for w in pool["wake_waits"])


def test_the_pool_summary_agrees_with_the_metrics_and_the_events(
    run: tuple[subprocess.CompletedProcess[str], Path], summary: dict[str, Any]
) -> None:
    """The evictions the operator counted (snooze_pool_evictions_total, by reason) are those its
    MakingRoom Events announced, and the terminal prints the same figures as summary.json."""
    result, _ = run
    [pool] = summary["pools"]
    events = [e for e in summary["events"] if e["reason"] == "MakingRoom"]
    for_starts = [e for e in events if " for starting " in e["message"]]
    # An eviction counts, and its Event is posted, once its sleep begins; one chosen and then
    # spared (busy) is neither. The summary's Events were read after its metrics.
    assert 1 <= pool["swaps"] <= len(events) - len(for_starts)
    assert pool["start_evictions"] <= len(for_starts)
    assert len(summary["swaps"]) <= len(events)  # the last Events may come after the last sample
    lines = result.stdout.splitlines()
    assert (
        "GPUPool gpu-0: 4 models (translate, sql, legal, support) of 30 GiB each on one GPU of "
        "70 GiB: 1 GPU where one GPU per model takes 4"
    ) in lines
    waits = len(pool["wake_waits"])
    assert any(
        line.startswith(f"  swaps: {pool['swaps']} members put to sleep to make room for a wake")
        and f"over {waits} wakes" in line
        for line in lines
    ), result.stdout[-3000:]
    assert any(
        line.startswith(f"  at most {pool['most_awake']} awake at once")
        and "wakes out of memory: 0 (snooze_pool_oom_total), 0 (the simulated GPU's count)" in line
        for line in lines
    )


def test_the_pool_shows_where_a_person_looks(
    run: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    """The live view says who sleeps for whom, who waits for room and why, and the pool's
    memory; the timeline has the pool's row."""
    result, _ = run
    out = result.stdout
    assert "deployed legal (its InferenceModel and Deployment) on GPUPool gpu-0" in out
    assert re.search(r"gpu-0: \S+ \((translate|sql|legal|support)\) sleeps to make room for", out)
    assert re.search(r"held \d+; waiting for 29GiB on GPUPool gpu-0: ", out)
    assert re.search(r"\| GPUPool gpu-0: \d+ of 70 GiB used, awake: ", out)


def test_the_summary_compares_like_with_like(
    run: tuple[subprocess.CompletedProcess[str], Path], summary: dict[str, Any]
) -> None:
    """The run's own requests replayed through whatif's engine twice, each model's idle.after
    as a fixed TTL on GPUs of its own and the models as deployed, devices held first: both
    sides replayed, none measured against a simulation."""
    result, _ = run
    both = summary["replayed"]
    rows = {r["model"]: r for r in both["models"]}
    assert set(rows) == {m["model"] for m in summary["models"]}
    for model, row in rows.items():
        asked = [r for r in summary["requests"] if r["model"] == model]
        assert row["requests"] == len(asked)
        assert row["ttl_gpu_hours"] > 0 and row["deployed_gpu_hours"] > 0
        assert 0 <= row["ttl_held"] <= row["requests"]
    # On GPUs of their own the pool's members never sleep (idle.after: Never): nothing held,
    # awake all along; on the shared GPU they take turns.
    for model in ("translate", "sql", "legal", "support"):
        assert rows[model]["policy"] == "always-on" and rows[model]["ttl_held"] == 0
        assert rows[model]["deployed_gpu_hours"] < rows[model]["ttl_gpu_hours"]
    fixed, deployed = both["fixed_ttl"], both["as_deployed"]
    assert (fixed["devices_always_on"], deployed["devices_always_on"]) == (11, 8)
    assert deployed["device_hours"] < fixed["device_hours"]
    assert "both replayed through snooze whatif's engine" in result.stdout
    assert "GPUs held all along: 11 with a fixed TTL, 8 as deployed" in result.stdout
