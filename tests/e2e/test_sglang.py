"""SGLang servers under the real operator: put to sleep when idle and woken on request, their
state kept on the pod, refused when they cannot sleep, and never released under a request
(asserted on what the simulated server saw)."""

from __future__ import annotations

import threading
from typing import Any

import httpx
from waits import wait_for

from snooze.api.agreed import RELEASED_ANNOTATION
from snooze.sim.sglang.engine import SGLangConfig, SGLangEngine

from .conftest import FAST, Cluster, OperatorThread, next_address
from .test_keepawake import daily_from_now, learnt_everywhere

LABELS = {"app": "sg"}
SPEC = {
    "selector": {"matchLabels": LABELS},
    "engine": {"kind": "sglang"},
    "idle": {"after": "1s"},
    "sleep": {"level": 2},
}


def sglang_pod(cluster: Cluster, name: str = "sg-0", **changes: Any) -> SGLangEngine:
    config = SGLangConfig(
        model="sg",
        host=next_address(),
        port=8000,
        sleep_seconds=0.05,
        level2_sleep_seconds=0.05,
        wake_seconds=0.05,
        reload_seconds=0.05,
        checksum_seconds_per_gib=0.001,
        **changes,
    )
    engine = cluster.create_pod(name, labels=LABELS, engine=config)
    assert isinstance(engine, SGLangEngine)
    return engine


def released(cluster: Cluster, name: str = "sg-0") -> str | None:
    pod = cluster.pod(name) or {}
    value = ((pod.get("metadata") or {}).get("annotations") or {}).get(RELEASED_ANNOTATION)
    return None if value is None else str(value)


def test_an_idle_sglang_server_is_released_and_woken_on_request(
    cluster: Cluster, operator: OperatorThread
) -> None:
    engine = sglang_pod(cluster)
    cluster.create_model("sg", SPEC)
    wait_for("the pod labelled asleep", lambda: cluster.pod_state("sg-0") == "asleep")
    assert engine.released == {"kv_cache", "weights", "cuda_graph"}
    assert engine.generation_paused and engine.scheduler_pause == "retract"
    # The state SGLang does not keep, kept on the pod: its run (the sandbox's pods have no
    # container status, so no restart count) and what is released or paused.
    assert released(cluster) == ":cuda_graph,kv_cache,paused,weights"
    wait_for("phase Asleep", lambda: cluster.status("sg")["phase"] == "Asleep")

    cluster.request_wake("sg")
    wait_for("the pod labelled awake", lambda: cluster.pod_state("sg-0") == "awake")
    assert not engine.released and not engine.generation_paused and not engine.dead
    assert engine.calls["update_weights_from_disk"] == 1  # no host copy: reloaded
    assert released(cluster) is None
    wait_for("phase Awake", lambda: cluster.status("sg")["phase"] == "Awake")
    answer = httpx.post(f"{engine.url}/v1/completions", json={"prompt": "hi"}, timeout=5)
    assert "garbage" not in answer.text
    wait_for("a Woke event", lambda: cluster.events("Woke"))
    # Its weights' digests (/weights_checker) recorded before the sleep, compared after the
    # reload.
    wait_for("the weights checked twice", lambda: engine.checksum_calls == 2)
    integrity = wait_for(
        "the weights verified",
        lambda: (c := cluster.condition("sg", "WakeVerified")) and c["status"] == "True" and c,
    )
    assert "Weights recorded on 1 engine: compared after level-2 wakes" in integrity["message"]


def test_a_spec_level_the_servers_flags_do_not_make_is_said_once(
    cluster: Cluster, operator: OperatorThread
) -> None:
    """spec.sleep.level asks 1 of a server without --enable-weights-cpu-backup: it sleeps at
    level 2 (its weights dropped, reloaded at the wake), and one Warning says so and what to
    change, however many times the operator looks at it."""
    engine = sglang_pod(cluster)
    cluster.create_model("sg", {**SPEC, "sleep": {"level": 1}})
    wait_for("the pod labelled asleep", lambda: cluster.pod_state("sg-0") == "asleep")
    cluster.request_wake("sg")
    wait_for("the pod labelled awake", lambda: cluster.pod_state("sg-0") == "awake")
    assert engine.calls["update_weights_from_disk"] == 1  # level 2: reloaded
    wait_for("asleep again", lambda: cluster.pod_state("sg-0") == "asleep")
    [told] = cluster.events("ServerSetsLevel")
    assert told["type"] == "Warning"
    assert told["message"] == (
        "sg-0: sleeps at level 2, not the level 1 spec.sleep.level asks: an SGLang server's "
        "level is its own flag, and it runs without --enable-weights-cpu-backup: its weights "
        "are reloaded at each wake. Set spec.sleep.level: 2, or add the flag"
    )
    cluster.patch_model("sg", {"spec": {"sleep": {"level": 2}}})
    cluster.request_wake("sg")
    wait_for("the pod labelled awake", lambda: cluster.pod_state("sg-0") == "awake")
    assert len(cluster.events("ServerSetsLevel")) == 1  # the spec now asks what it does


def test_a_server_without_the_memory_saver_is_never_paused_and_says_why(
    cluster: Cluster, operator: OperatorThread
) -> None:
    engine = sglang_pod(cluster, memory_saver=False)
    cluster.create_model("sg", SPEC)
    condition = wait_for(
        "a SleepFailed condition",
        lambda: (c := cluster.condition("sg", "SleepFailed")) and c["status"] == "True" and c,
    )
    assert condition["reason"] == "SleepModeDisabled"
    assert "--enable-memory-saver" in condition["message"]
    assert cluster.pod_state("sg-0") == "awake"
    assert engine.calls == {}  # never paused, never released: it serves on


def test_a_busy_sglang_server_is_never_released_mid_request(
    cluster: Cluster, operator: OperatorThread
) -> None:
    engine = sglang_pod(cluster, token_seconds=0.05, max_tokens_default=60)
    cluster.create_model("sg", SPEC)
    wait_for("the pod labelled awake", lambda: cluster.pod_state("sg-0") == "awake")
    # A request sent straight to the server (the gateway's counts do not see it): three
    # seconds of tokens, well past idle.after.
    answers: list[httpx.Response] = []
    thread = threading.Thread(
        target=lambda: answers.append(
            httpx.post(f"{engine.url}/v1/completions", json={"prompt": "long"}, timeout=30)
        )
    )
    thread.start()
    wait_for("the request running", lambda: engine.running == 1)
    wait_for("the pod labelled asleep", lambda: cluster.pod_state("sg-0") == "asleep", timeout=30)
    thread.join()
    assert answers[0].status_code == 200
    # Answered in full, never aborted (beside it, the greedy checks recorded before the sleep).
    assert engine.finished["stop"] == 1 and "abort" not in engine.finished
    assert engine.death is None and not engine.dead
    assert engine.released == {"kv_cache", "weights", "cuda_graph"}


def test_a_keep_awake_window_resumes_a_released_server_before_any_request(
    cluster: Cluster, operator: OperatorThread
) -> None:
    engine = sglang_pod(cluster)
    window = {"name": "burst", "cron": daily_from_now(10), "duration": "3s", "minAwake": 1}
    cluster.create_model("sg", {**SPEC, "schedule": [window]})
    wait_for("released between windows", lambda: engine.released, timeout=30)
    wait_for(
        "resumed by the window",
        lambda: not engine.released and not engine.generation_paused,
        timeout=30,
    )
    assert "snooze.dev/wake-requested-at" not in (
        cluster.model("sg")["metadata"].get("annotations") or {}
    )  # no request asked for it
    wait_for("a WindowStarted event", lambda: cluster.events("WindowStarted"))
    wait_for("released after the window", lambda: engine.released, timeout=30)
    assert not engine.dead


def test_a_prewake_resumes_a_released_server_before_any_request(cluster: Cluster) -> None:
    """Pre-wake is engine-blind: a profile that expects requests in every slot, kept on the
    status by an earlier operator, has a released SGLang server resumed with no request."""
    engine = sglang_pod(cluster)
    cluster.create_model("sg", {**SPEC, "prewake": {"lead": "10m"}})
    learnt_everywhere(cluster, "sg")
    thread = OperatorThread(FAST).start()
    try:
        wait_for("released", lambda: engine.sleep_calls > 0, timeout=30)
        wait_for(
            "resumed ahead of requests",
            lambda: engine.calls.get("resume_memory_occupation", 0) > 0,
            timeout=30,
        )
        event = wait_for("a Prewake event", lambda: cluster.events("Prewake"))
        assert "woken ahead of the requests expected from" in event[0]["message"]
        assert "snooze.dev/wake-requested-at" not in (
            cluster.model("sg")["metadata"].get("annotations") or {}
        )  # no request asked for it
        wait_for(
            "the pod labelled awake",
            lambda: cluster.pod_state("sg-0") == "awake" and not engine.released,
        )
        assert not engine.dead
    finally:
        thread.stop()
