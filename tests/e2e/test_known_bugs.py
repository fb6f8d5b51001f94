"""Known-bad vLLM combinations (policy/knownbugs.py's table), met by the real operator: it
reads the pod's arguments and the engine's release, says so on the KnownBug condition, and
does what wake.onKnownBug says, against simulated engines of those releases."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
from waits import wait_for

from snooze.sim import SimulatedEngine

from .conftest import Cluster, OperatorThread

LABELS = {"app": "chat"}
LORA_TP2 = ["serve", "org/model", "--enable-lora", "--lora-modules", "a=/a", "-tp", "2"]


# Not a manifest (tests/builders.py): creates the model in the sandbox.
def model(cluster: Cluster, **spec: Any) -> None:
    cluster.create_model("chat", {"selector": {"matchLabels": LABELS}, **spec})


def known_bug(cluster: Cluster) -> dict[str, Any]:
    """The condition once the engine's release is known (until then every row that its
    arguments fit applies: an unknown release is not taken as safe)."""
    condition = wait_for(
        "the KnownBug condition, naming the release",
        lambda: (
            (c := cluster.condition("chat", "KnownBug"))
            and c["status"] == "True"
            and "release not known" not in c["message"]
            and c
        ),
    )
    found: dict[str, Any] = condition
    return found


def test_lora_at_tensor_parallel_2_sleeps_at_level_2_instead_of_1(
    cluster: Cluster, operator: OperatorThread
) -> None:
    """vllm#53888: a level-1 wake corrupts the LoRA state at tensor parallel > 1. Level 2 is
    safe from 0.28.0 (vllm#39935's fix): FallBack, the default, sleeps there."""
    engine = cluster.create_pod(
        "chat-0", labels=LABELS, args=LORA_TP2, vllm_version="0.28.0", tensor_parallel_size=2
    )
    model(cluster, idle={"after": "1s"}, sleep={"level": 1})
    condition = known_bug(cluster)
    assert condition["reason"] == "KnownBadCombination"
    assert "vLLM 0.28.0" in condition["message"] and "lora-tp-level1" in condition["message"]
    assert "sleeps at level 2 instead of 1" in condition["message"]
    wait_for("asleep", lambda: cluster.pod_state("chat-0") == "asleep", timeout=30)
    assert engine.sleep_level == 2 and engine.sleep_calls == 1


def test_no_safe_level_means_no_sleep(cluster: Cluster, operator: OperatorThread) -> None:
    """Before 0.28.0 level 2 breaks LoRA too (vllm#39934): nothing is safe, the engine stays
    awake; NeverSleep does the same whatever the level."""
    engine = cluster.create_pod(
        "chat-0", labels=LABELS, args=LORA_TP2, vllm_version="0.27.1", tensor_parallel_size=2
    )
    model(cluster, idle={"after": "1s"})
    condition = known_bug(cluster)
    assert "stays awake: no sleep level is safe" in condition["message"]
    assert "lora-level2" in condition["message"] and "vllm#39934" in condition["message"]
    wait_for("awake", lambda: cluster.pod_state("chat-0") == "awake")
    deadline = time.monotonic() + 3.0  # three times idle.after: it would have slept
    while time.monotonic() < deadline:
        assert cluster.pod_state("chat-0") == "awake" and engine.sleep_calls == 0
        time.sleep(0.1)


def test_sleep_anyway_is_told_and_sleeps(cluster: Cluster, operator: OperatorThread) -> None:
    engine = cluster.create_pod(
        "chat-0", labels=LABELS, args=LORA_TP2, vllm_version="0.28.0", tensor_parallel_size=2
    )
    model(cluster, idle={"after": "1s"}, wake={"onKnownBug": "SleepAnyway"})
    assert "sleeps at level 1 anyway" in known_bug(cluster)["message"]
    wait_for("asleep", lambda: cluster.pod_state("chat-0") == "asleep", timeout=30)
    assert engine.sleep_level == 1


def stream(
    engine: SimulatedEngine, tokens: int, done: list[httpx.Response | httpx.HTTPError]
) -> threading.Thread:
    """A long request straight to the engine (not through the gateway: the drain cannot stop
    it), in a thread of its own; `done` gets its answer, or the error its client saw."""

    def run() -> None:
        body = {"model": "m", "prompt": "x", "max_tokens": tokens}
        try:
            done.append(httpx.post(engine.url + "/v1/completions", json=body, timeout=60))
        except httpx.HTTPError as error:  # the engine died under it
            done.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    wait_for("the request running", lambda: engine.running == 1)
    return thread


def test_a_drain_that_times_out_is_given_up_where_sleep_would_kill_the_engine(
    cluster: Cluster, operator: OperatorThread
) -> None:
    """vllm#45520: before 0.25.0 a /sleep that meets requests in flight kills an engine at
    tensor parallel > 1. Told to sleep (desiredState: Asleep) while a long request runs, the
    operator drains for --drain-timeout (2 s here), then gives up rather than send /sleep."""
    engine = cluster.create_pod(
        "chat-0",
        labels=LABELS,
        args=["serve", "org/model", "--tensor-parallel-size=2"],
        vllm_version="0.24.0",
        tensor_parallel_size=2,
        token_seconds=0.05,
    )
    model(cluster, idle={"after": "1h"})
    wait_for("awake", lambda: cluster.pod_state("chat-0") == "awake")
    assert "in-flight-sleep-parallel" in known_bug(cluster)["message"]
    answers: list[httpx.Response | httpx.HTTPError] = []
    thread = stream(engine, tokens=120, done=answers)  # 6 s of tokens
    cluster.patch_model("chat", {"spec": {"desiredState": "Asleep"}})
    wait_for("the drain given up", lambda: cluster.events("SleepFailed"), timeout=10)
    [event] = cluster.events("SleepFailed")
    assert "requests were still in flight" in event["message"], event["message"]
    assert engine.sleep_calls == 0 and not engine.crashed
    thread.join(30)
    [answer] = answers
    assert isinstance(answer, httpx.Response), answer
    assert answer.json()["choices"][0]["finish_reason"] == "length"
    # Drained now: the next try sleeps it, safely.
    wait_for("asleep", lambda: cluster.pod_state("chat-0") == "asleep", timeout=30)
    assert not engine.crashed


def test_sleep_anyway_sends_it_and_the_engine_dies(
    cluster: Cluster, operator: OperatorThread
) -> None:
    """What the default saves: with SleepAnyway the drain times out and /sleep goes. A release
    before 0.17 reads no mode (Snooze's mode=wait, which has later ones wait for the requests,
    is lost on it): the simulated 0.16.0 engine aborts them and dies (vllm#45520)."""
    engine = cluster.create_pod(
        "chat-0",
        labels=LABELS,
        args=["serve", "org/model", "-tp", "2"],
        vllm_version="0.16.0",
        tensor_parallel_size=2,
        token_seconds=0.05,
    )
    model(cluster, idle={"after": "1h"}, wake={"onKnownBug": "SleepAnyway"})
    wait_for("awake", lambda: cluster.pod_state("chat-0") == "awake")
    answers: list[httpx.Response | httpx.HTTPError] = []
    thread = stream(engine, tokens=120, done=answers)
    cluster.patch_model("chat", {"spec": {"desiredState": "Asleep"}})
    wait_for("the engine dead", lambda: engine.crashed, timeout=15)
    # Its client's request died with it, unfinished: aborted, or cut off.
    thread.join(30)
    [answer] = answers
    if isinstance(answer, httpx.Response):
        assert answer.json()["choices"][0]["finish_reason"] == "abort", answer.text


def test_level_2_where_the_release_cannot_reload_sleeps_at_level_1(
    cluster: Cluster, operator: OperatorThread
) -> None:
    """Before 0.10.2 vLLM has no /collective_rpc: a level-2 wake cannot reload the discarded
    weights (0.8.0 to 0.8.2 even wake serving them). The spec asks level 2: the operator says
    why not, naming the release from which it works, and sleeps the engine at level 1; it
    wakes right."""
    engine = cluster.create_pod("chat-0", labels=LABELS, vllm_version="0.8.2")
    model(cluster, idle={"after": "1s"}, sleep={"level": 2})
    condition = known_bug(cluster)
    assert condition["reason"] == "LevelNotSupported"
    message = condition["message"]
    assert "vLLM 0.8.2" in message and "sleep level 2 needs vLLM 0.10.2 or later" in message
    assert "sleeps at level 1 instead of 2" in message and "Upgrade vLLM" in message
    wait_for("asleep", lambda: cluster.pod_state("chat-0") == "asleep", timeout=30)
    assert engine.sleep_level == 1 and engine.host_memory_bytes > 0
    assert cluster.pod("chat-0")["metadata"]["annotations"]["snooze.dev/sleep-level"] == "1"
    cluster.patch_model("chat", {"spec": {"desiredState": "Awake"}})
    wait_for("awake", lambda: cluster.pod_state("chat-0") == "awake", timeout=30)
    assert engine.weights_valid and engine.seen["POST /collective_rpc"] == 0
