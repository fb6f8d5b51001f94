"""The operator's settings, one set for the whole process, from its command line."""

from __future__ import annotations

from dataclasses import dataclass

from snooze.api.models import InferenceModelSpec

WRITE_BURST_INTERVALS = 30.0
"""A namespace's budget is spent in bursts of up to this many probe intervals' worth: 60
writes a model at the default budget, some five sleeps and wakes of each at once (a GPU pool
that starts and swaps its members, a keep-awake window that wakes them all)."""


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Operator-wide knobs, from the command line."""

    probe_interval: float = 10.0
    drain_timeout: float = 60.0
    """Longest wait for in-flight requests before a sleep is sent anyway (mode=wait then
    lets vLLM finish them itself)."""
    drain_poll: float = 0.25
    probe_timeout: float = 5.0
    write_budget: float = 2.0
    """Each namespace's budget of API writes: this many per probe interval for each of its
    models (12 a minute at the default interval: a sleep and a wake a minute), in bursts of up
    to WRITE_BURST_INTERVALS' worth (kube/writes.py); 0: no budget. Per interval, so that an
    operator run at a faster pace (the tests', the demo's) has a budget to match; a longer
    interval than the default's counts as the default's (budget_per_minute)."""
    record_timeout: float = 300.0
    """The longest an engine's first record (its greedy answers and its weights' digests, taken
    while it drains before its first sleep) may hold that sleep: cut beyond it, said on the
    status, and taken again at the next sleep. A wake asked meanwhile cuts it at once."""
    min_sleep_timeout: float = 60.0
    """The least time a /sleep may take before it counts as failed (freeing tens of GiB takes
    seconds; the model's wake.timeout applies when longer)."""
    gateway_metrics: tuple[str, ...] = ()
    """Metrics URLs of the gateway's replicas, whose per-engine counters spare probes."""
    gateway_service: str | None = None
    """The gateway's metrics Service (`namespace/name`): its replicas found from its
    EndpointSlices, every probe interval."""
    drift_interval: float = 60.0
    """The longest an engine goes unprobed when no decision depends on it (asleep, or known
    active from the gateway's counters): to notice what nobody told the operator."""
    status_interval: float = 600.0
    """How often a model's status may be written when only its activity times moved (a phase,
    a count or a condition that changes is written at once)."""
    inference_gateway: bool = False
    """Read the endpoint pickers of the Inference Extension's InferencePools that select models'
    pods: requests queued there wake their model (operator/traffic/pickers.py)."""
    picker_interval: float = 2.0
    """How often those pickers are read: a queued request waits up to this long for its wake
    to be asked for."""
    picker_token_file: str | None = None
    """A file holding the bearer token sent to the pickers' metrics ports (they check it with a
    TokenReview and a SubjectAccessReview); None: no token is sent."""
    crd_poll_interval: float = 5.0
    """How often an operator started before its CRDs (InferenceModel, GPUPool) asks whether
    they are installed yet."""
    peering_lifetime: int = 60
    """With peering: how long a replica's keep-alive counts; a standby takes over this long
    after the active replica's last one (kopf refreshes it 5 to 10 s before it expires)."""


def budget_per_minute(settings: Settings) -> float:
    """Each model's share of its namespace's write budget, per minute: write_budget per probe
    interval, the interval counted as at most the default's (a slower probe pace is no reason
    for slower writes)."""
    return settings.write_budget * 60.0 / min(settings.probe_interval, Settings.probe_interval)


def sleep_timeout(spec: InferenceModelSpec, settings: Settings) -> float:
    """How long a /sleep call may take: freeing tens of GiB takes seconds, not minutes."""
    return max(spec.wake_timeout_seconds, settings.min_sleep_timeout)
