"""The words of the operator's Events and log lines: why a step was taken, and what a failed
check found."""

from __future__ import annotations

from snooze.policy.integrity import Verdict
from snooze.policy.sleep import Action

# Where the claims of Snooze's own steps come from (policy/brakes.py believes them at once).
AFTER_SLEEP = "/is_sleeping after its /sleep"
AFTER_WAKE = "/is_sleeping after its /wake_up"


def with_weights(output: Verdict, weights: Verdict | None) -> str:
    """An output check's failure, with what the weights' check said of it."""
    if weights is None:
        return f"{output.message} (its weights were not checked)"
    if weights.failed:
        return f"{output.message}: {weights.message}"
    return f"{output.message}, while {weights.message}"


def why(action: Action) -> str:
    """Why the policy took `action`, as an Event says it."""
    return {
        "Idle": "idle for longer than idle.after",
        "DesiredAsleep": "desiredState is Asleep",
        "DesiredAwake": "desiredState is Awake",
        "WakeRequested": "a wake was requested",
        "MinAwake": "minAwake engines must stay awake",
        "Primed": "woken back after a sleep that only pinned its host copy (the pool's prime)",
    }.get(action.reason, action.reason)
