"""The words of the status's conditions: their types, and the reasons the operator gives (a
failed wake's or sleep's reason is api/reasons.py's). StrEnums: the wire format is the same
strings, and each word is spelled here once."""

from __future__ import annotations

from enum import StrEnum


class ConditionType(StrEnum):
    """`status.conditions[].type` of an InferenceModel, and of a GPUPool (the last three)."""

    READY = "Ready"
    """The model can serve: an engine is awake, or a request can wake one."""
    AWAKE = "Awake"
    ASLEEP = "Asleep"
    WAKE_FAILED = "WakeFailed"
    SLEEP_FAILED = "SleepFailed"
    SPEC_VALID = "SpecValid"
    """On a model and on a GPUPool."""
    CONFLICT = "Conflict"
    SHARED_PODS = "SharedPods"
    WAITING_FOR_ROOM = "WaitingForRoom"
    WAKE_VERIFIED = "WakeVerified"
    KNOWN_BUG = "KnownBug"
    PICKER_READABLE = "PickerReadable"
    """Only on a model that InferencePools serve."""
    OVERCOMMITTED = "Overcommitted"
    CLAIM_CONFLICT = "ClaimConflict"
    MEMORY_NOT_FREED = "MemoryNotFreed"


MODEL_CONDITIONS = (
    ConditionType.READY,
    ConditionType.AWAKE,
    ConditionType.ASLEEP,
    ConditionType.WAKE_FAILED,
    ConditionType.SLEEP_FAILED,
    ConditionType.SPEC_VALID,
    ConditionType.CONFLICT,
    ConditionType.SHARED_PODS,
    ConditionType.WAITING_FOR_ROOM,
    ConditionType.WAKE_VERIFIED,
    ConditionType.KNOWN_BUG,
    ConditionType.PICKER_READABLE,
)
POOL_CONDITIONS = (
    ConditionType.SPEC_VALID,
    ConditionType.OVERCOMMITTED,
    ConditionType.CLAIM_CONFLICT,
    ConditionType.MEMORY_NOT_FREED,
)


class ConditionReason(StrEnum):
    """`status.conditions[].reason`, but for a failed wake's or sleep's (api/reasons.py) and
    WakeVerified's, which are the integrity checks' own words (policy/integrity.py)."""

    # SpecValid, and Ready while the spec is invalid.
    VALID = "Valid"
    INVALID_SPEC = "InvalidSpec"
    # Ready.
    ENGINES_AWAKE = "EnginesAwake"
    SCALED_TO_ZERO = "ScaledToZero"
    SCALING_UP = "ScalingUp"
    NO_PODS = "NoPods"
    """Ready False while the selector matches no pod: unless a wake can scale its workload up
    (scaleTargetRef), nothing serves it until someone starts its pods, and the gateway
    answers its requests at once rather than hold them."""
    NO_ENGINES = "NoEngines"
    WAKING = "Waking"
    ABLE_TO_WAKE = "AbleToWake"
    WAKE_DISABLED = "WakeDisabled"
    WAKE_FAILED = "WakeFailed"
    """Also WakeFailed's, for a failure that gave no reason of its own."""
    ENGINES_UNREACHABLE = "EnginesUnreachable"
    NO_ENGINE_AWAKE = "NoEngineAwake"
    """Also Awake's."""
    # Asleep.
    ALL_ASLEEP = "AllAsleep"
    NOT_ALL_ASLEEP = "NotAllAsleep"
    # WakeFailed and SleepFailed.
    NO_FAILURES = "NoFailures"
    SLEEP_FAILED = "SleepFailed"
    """SleepFailed's, for a failure that gave no reason of its own."""
    # Conflict (and Ready).
    MODEL_NAME_TAKEN = "ModelNameTaken"
    NAME_HELD = "NameHeld"
    NO_MODEL_NAME = "NoModelName"
    # WaitingForRoom.
    POOL_FULL = "PoolFull"
    NOT_WAITING = "NotWaiting"
    # SharedPods.
    PODS_SHARED = "PodsShared"
    NO_SHARED_PODS = "NoSharedPods"
    # WakeVerified, besides the checks' own words.
    VERIFICATION_OFF = "VerificationOff"
    NO_ENGINE = "NoEngine"
    NOT_RECORDED_YET = "NotRecordedYet"
    # KnownBug.
    NO_KNOWN_BUG = "NoKnownBug"
    KNOWN_BAD_COMBINATION = "KnownBadCombination"
    LEVEL_NOT_SUPPORTED = "LevelNotSupported"
    # PickerReadable: read, or why not (with api/reasons.py's for a page that did not answer).
    READ = "Read"
    PICKER_NOT_FOUND = "PickerNotFound"
    API_ERROR = "ApiError"
    NOT_A_SERVICE = "NotAService"
    NO_METRICS_PORT = "NoMetricsPort"
    NOT_A_POD = "NotAPod"
    NO_ENDPOINTS = "NoEndpoints"
    TOKEN_UNREADABLE = "TokenUnreadable"
    TOO_MANY_POOLS = "TooManyPools"
    INVALID_POOL = "InvalidPool"
    UNAUTHORIZED = "Unauthorized"
    FORBIDDEN = "Forbidden"
    # A GPUPool's ClaimConflict, MemoryNotFreed and Overcommitted.
    CLAIM_NAMED_TWICE = "ClaimNamedTwice"
    NO_CONFLICT = "NoConflict"
    SLEEP_KEEPS_MEMORY = "SleepKeepsMemory"
    TRUSTED = "Trusted"
    FOOTPRINTS_EXCEED_MEMORY = "FootprintsExceedMemory"
    FITS = "Fits"


class GateReason(StrEnum):
    """The reason of a pod's snooze.dev/awake condition, its readiness gate
    (policy/readiness.py): why its engine does or does not serve now."""

    AWAKE = "Awake"
    DRAINING = "Draining"
    ASLEEP = "Asleep"
    WAKING = "Waking"
    WAKE_FAILED = "WakeFailed"
    UNREACHABLE = "Unreachable"
    NOT_PROBED = "NotProbed"
    CONTAINERS_NOT_READY = "ContainersNotReady"
    RELEASED = "Released"
