"""Wakes come first: a wake asked while an engine's first record is under way (its drain before
its first sleep) is not held by it, and a record that takes too long is cut so that the sleep
goes on. Simulated engines hash their weights as slowly as a large model does on one rank."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from waits import wait_for

from snooze.operator.embedded import OperatorThread
from snooze.sandbox import Sandbox

from .conftest import FAST, Cluster

GIB = 16.0  # the simulated engine's weights (EngineConfig.gpu_memory_gib's default)


def spec(app: str, **extra: object) -> dict[str, object]:
    return {"selector": {"matchLabels": {"app": app}}, "idle": {"after": "1s"}, **extra}


def state(cluster: Cluster, model: str) -> str | None:
    pods = cluster.status(model).get("pods") or [{}]
    value: str | None = pods[0].get("state")
    return value


def verification(cluster: Cluster, model: str) -> dict[str, str]:
    pods = cluster.status(model).get("pods") or [{}]
    found: dict[str, str] = pods[0].get("verification") or {}
    return found


def timed_wake(cluster: Cluster, model: str) -> float:
    """From the wake request to the status saying awake (what the gateway waits for)."""
    began = time.monotonic()
    cluster.request_wake(model)
    wait_for(f"{model} awake", lambda: state(cluster, model) == "awake", timeout=60)
    return time.monotonic() - began


@pytest.fixture
def short_records(sandbox: Sandbox) -> Iterator[OperatorThread]:
    thread = OperatorThread(replace(FAST, record_timeout=1.0)).start()
    yield thread
    thread.stop()


def test_a_wake_asked_during_a_slow_first_record_is_not_held_by_it(
    cluster: Cluster, operator: OperatorThread
) -> None:
    # The control: a model without records, woken from its sleep.
    cluster.create_pod("quick-0", labels={"app": "quick"})
    cluster.create_model("quick", spec("quick", wake={"verify": False}))
    wait_for("quick asleep", lambda: state(cluster, "quick") == "asleep", timeout=30)
    control = timed_wake(cluster, "quick")

    # Its weights take 90 s to hash, as a 70B model's take on one rank about twice that.
    slow = cluster.create_pod("slow-0", labels={"app": "slow"}, checksum_seconds_per_gib=90 / GIB)
    cluster.create_model("slow", spec("slow"))
    wait_for(
        "the first record's digests under way",
        lambda: slow.checksum_calls == 1 and cluster.pod_state("slow-0") == "draining",
        timeout=30,
    )
    during = timed_wake(cluster, "slow")

    # Before, the wake waited for the digests (61 s of a 90 s one, in the run).
    assert during <= max(2 * control, control + 1.0), (during, control)
    assert not slow.is_sleeping
    wait_for(
        "SleepCancelled told",
        lambda: any("slow-0" in e["message"] for e in cluster.events("SleepCancelled")),
    )


def test_digests_a_wake_left_under_way_are_kept_when_they_come(
    cluster: Cluster, operator: OperatorThread
) -> None:
    slow = cluster.create_pod("slow-0", labels={"app": "slow"}, checksum_seconds_per_gib=3 / GIB)
    cluster.create_model("slow", spec("slow", desiredState="Asleep"))
    wait_for(
        "the digests under way",
        lambda: slow.checksum_calls == 1 and cluster.pod_state("slow-0") == "draining",
        timeout=30,
    )
    cluster.patch_model("slow", {"spec": {"desiredState": "Auto"}})
    cluster.request_wake("slow")
    wait_for("awake", lambda: state(cluster, "slow") == "awake", timeout=10)
    # vLLM finishes the digests it began: kept, and its next sleep does not ask again.
    wait_for(
        "the digests recorded",
        lambda: verification(cluster, "slow").get("weights") == "Recorded",
        timeout=30,
    )
    wait_for("asleep", lambda: state(cluster, "slow") == "asleep", timeout=30)
    assert slow.checksum_calls == 1


def test_a_first_record_longer_than_its_bound_is_cut_and_said(
    cluster: Cluster, short_records: OperatorThread
) -> None:
    slow = cluster.create_pod("slow-0", labels={"app": "slow"}, checksum_seconds_per_gib=5 / GIB)
    cluster.create_model("slow", spec("slow"))
    wait_for("asleep", lambda: state(cluster, "slow") == "asleep" and slow.is_sleeping, timeout=30)
    found = verification(cluster, "slow")
    assert found.get("weights") == "Unavailable", found
    assert "took longer than 1s" in found.get("message", ""), found

    # The model's status claims no more than was checked: the weights were not.
    def unverified() -> dict[str, Any] | None:
        found = cluster.condition("slow", "WakeVerified")
        return found if found is not None and found["status"] != "True" else None

    verified = wait_for("WakeVerified not True", unverified, timeout=10)
    assert (verified["status"], verified["reason"]) == ("False", "Unavailable"), verified
    assert verified["message"].startswith("slow-0: its record before its first sleep"), verified
    assert "Weights not checked on any engine" in verified["message"], verified
    # Taken again at its next sleep.
    cluster.request_wake("slow")
    wait_for("a second try", lambda: slow.checksum_calls == 2, timeout=30)
