"""The reasons of the Kubernetes Events the operator posts on models and GPUPools (`kubectl
events`, `snooze_events`): a StrEnum, so each is spelled once and goes out as the same string."""

from __future__ import annotations

from enum import StrEnum


class EventReason(StrEnum):
    # A step of an engine's sleep or wake.
    DRAINING = "Draining"
    SLEPT = "Slept"
    SLEEP_CANCELLED = "SleepCancelled"
    SLEEP_FAILED = "SleepFailed"
    WAKING = "Waking"
    WOKE = "Woke"
    WAKE_FAILED = "WakeFailed"
    WAKE_GAVE_UP = "WakeGaveUp"
    WAKE_INTERRUPTED = "WakeInterrupted"
    """Found after a restart of the operator: a wake it did not see end left the engine asleep."""
    WAKE_REQUESTED = "WakeRequested"
    PREWAKE = "Prewake"
    POD_RESTARTED = "PodRestarted"
    # What the operator sees of a model's engines and pods.
    ENGINE_UNREACHABLE = "EngineUnreachable"
    ENGINE_REACHABLE = "EngineReachable"
    ENGINE_CONTRADICTS = "EngineContradicts"
    SERVER_SETS_LEVEL = "ServerSetsLevel"
    """An SGLang server whose flags make another sleep level than spec.sleep.level asks."""
    NO_PODS = "NoPods"
    PODS_FOUND = "PodsFound"
    POOL_MISMATCH = "PoolMismatch"
    # The spec, and what other models contest.
    INVALID_SPEC = "InvalidSpec"
    SPEC_VALID = "SpecValid"
    MODEL_NAME_TAKEN = "ModelNameTaken"
    MODEL_NAME_TAKEN_RESOLVED = "ModelNameTakenResolved"
    PODS_SHARED = "PodsShared"
    PODS_SHARED_RESOLVED = "PodsSharedResolved"
    # Keep-awake windows.
    WINDOW_STARTED = "WindowStarted"
    WINDOW_ENDED = "WindowEnded"
    # Scale to zero.
    SCALED_TO_ZERO = "ScaledToZero"
    SCALING_UP = "ScalingUp"
    SCALED_UP = "ScaledUp"
    SCALED_BY_HAND = "ScaledByHand"
    SCALE_TARGET_NOT_FOUND = "ScaleTargetNotFound"
    # A deleted model's pods handed back.
    RELEASED = "Released"
    RELEASE_FAILED = "ReleaseFailed"
    # On a GPUPool.
    MAKING_ROOM = "MakingRoom"
    MEMORY_NOT_FREED = "MemoryNotFreed"
    SLEEP_UNASKED = "SleepUnasked"
    OVERCOMMITTED = "Overcommitted"


RESOLVED = {
    EventReason.MODEL_NAME_TAKEN: EventReason.MODEL_NAME_TAKEN_RESOLVED,
    EventReason.PODS_SHARED: EventReason.PODS_SHARED_RESOLVED,
}
"""The Event that says a contest of the first kind has ended."""
