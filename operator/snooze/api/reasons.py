"""Why a wake or a sleep failed, in the words the status (`failureReason`, the WakeFailed and
SleepFailed conditions' reason), the Events and the metrics use: the engine client names its
errors with them, and the policy decides on them."""

from __future__ import annotations

from enum import StrEnum


class FailureReason(StrEnum):
    UNREACHABLE = "Unreachable"
    TIMEOUT = "Timeout"
    ENGINE_ERROR = "EngineError"
    ANSWER_TOO_LARGE = "AnswerTooLarge"
    INVALID_ANSWER = "InvalidAnswer"
    HYBRID_KV_CACHE_REINIT = "HybridKVCacheReinit"
    """The hybrid-model wake crash: the engine stays asleep until its pod restarts."""
    SLEEP_MODE_DISABLED = "SleepModeDisabled"
    OUT_OF_MEMORY = "OutOfMemory"
    """A wake found the device's memory taken (another engine on a shared GPU)."""
    OUTPUT_MISMATCH = "OutputMismatch"
    """A woken engine answered the recorded greedy request differently."""
    WEIGHTS_MISMATCH = "WeightsMismatch"
    """A woken engine's weight checksums differ from those recorded before its first sleep."""
    MEMORY_NOT_FREED = "MemoryNotFreed"
    """A GPU pool member whose sleep did not give its device memory back."""
    HTTP_ERROR = "HTTPError"
    """A page answered with an HTTP error, not what was asked."""
    COLD_START_TIMEOUT = "ColdStartTimeout"
    """A workload scaled back up from zero whose pods did not answer in wake.coldStartTimeout."""
    API_ERROR = "ApiError"
    """The Kubernetes API refused a step's write (its label, its pod)."""
    KNOWN_BUG = "KnownBug"
    """A sleep not asked for: the engine's release and arguments are a known bad combination."""
    NO_GENERATION_ROUTE = "NoGenerationRoute"
    """Neither completions route answers: a pooling model, with no answer to check."""
    REQUESTS_IN_FLIGHT = "RequestsInFlight"
    """An SGLang server refused to sleep while it ran requests."""
