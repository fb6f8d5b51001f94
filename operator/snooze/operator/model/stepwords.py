"""The words of the operator's Events and log lines: why a step was taken, and what a failed
check found."""

from __future__ import annotations

from snooze.policy.integrity import Verdict
from snooze.policy.sleep import Action, ActionReason

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
    return _WHY.get(action.reason, action.reason)


_WHY: dict[str, str] = {
    ActionReason.IDLE: "idle for longer than idle.after",
    ActionReason.DESIRED_ASLEEP: "desiredState is Asleep",
    ActionReason.DESIRED_AWAKE: "desiredState is Awake",
    ActionReason.WAKE_REQUESTED: "a wake was requested",
    ActionReason.MIN_AWAKE: "minAwake engines must stay awake",
    ActionReason.PRIMED: (
        "woken back after a sleep that only pinned its host copy (the pool's prime)"
    ),
}
