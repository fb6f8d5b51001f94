"""What the operator and the gateway must agree on, each said once: the label and annotation
keys written and read on pods and InferenceModels, a reason of the status the gateway acts
on, the names of the gateway's per-engine
metrics that the operator scrapes, and the bounds of the gateway's /idle, where it waits."""

from __future__ import annotations

from snooze.api.models import GROUP

# -- Labels and annotations --------------------------------------------------------------------

STATE_LABEL = f"{GROUP}/state"
"""On a pod: its engine's state as the operator published it (awake, draining, asleep, waking,
failed); the gateway routes only to pods its model's status, which the operator alone writes,
says are awake."""
POOL_LABEL = f"{GROUP}/pool"
"""On a pod: the GPUPool it is a member of (or it references the pool's ResourceClaim)."""
AWAKE_CONDITION = f"{GROUP}/awake"
"""On a pod that lists it among its `spec.readinessGates`: the condition the operator writes
"True" while the engine serves and "False" (with a reason) while it does not, so that the pod
is Ready, and so in every Service, EndpointSlice and InferencePool, only while it serves."""
WAKE_REQUESTED_ANNOTATION = f"{GROUP}/wake-requested-at"
"""On an InferenceModel: when a wake was last asked for (RFC 3339), by the gateway for a held
request, or by hand with `kubectl annotate`."""

# Progress marks on a pod, so that an operator restarted in the middle of a step resumes it
# rather than repeats or orphans it.
SLEEP_STARTED_ANNOTATION = f"{GROUP}/sleep-started-at"
"""When the drain before a sleep began (the pod was labelled draining)."""
SLEEP_SENT_ANNOTATION = f"{GROUP}/sleep-sent-at"
"""When /sleep was sent for that drain: from then on the engine may be freeing its memory."""
WAKE_PROGRESS_ANNOTATION = f"{GROUP}/wake-progress"
"""The steps of the wake under way that the engine has done (`weights,reload_weights`)."""
RELEASED_ANNOTATION = f"{GROUP}/released"
"""On the pod of an SGLang server: what the operator has released or paused on it and not yet
brought back (`3:kv_cache,paused,weights`: the engine container's restart count, then the
tags, `paused` for a pause not continued). SGLang keeps no sleep state that can be read, and
resuming what was not released kills the server: this is where the state is kept, written
before each call that changes it; a restart of the container voids it."""
SLEEP_LEVEL_ANNOTATION = f"{GROUP}/sleep-level"
"""The level the engine went to sleep at (a pool may choose 2 where the model asks for 1);
its wake follows it (for engines that do not publish vllm:engine_sleep_state)."""

# -- The gateway's metrics that the operator reads (operator/traffic/gateways.py) ------------
# As its page names the samples: a counter's carry `_total`.

POD_REQUESTS = "snooze_gateway_pod_requests_total"
"""Requests sent to each engine (pod) and answered, or failed after being sent."""
POD_IN_FLIGHT = "snooze_gateway_pod_requests_in_flight"
"""Requests being sent to, or answered by, each engine (pod) now."""
POD_LAST_REQUEST = "snooze_gateway_pod_last_request_timestamp_seconds"
"""When the last request to each engine (pod) ended, in seconds since the epoch."""
PODS_WENT_IDLE = "snooze_gateway_pods_went_idle_total"
"""Times an engine's last request in flight through the replica ended: what /idle counts."""
HELD_REQUESTS = "snooze_gateway_held_requests"
"""Requests waiting now for their model to wake."""
POD_STALLS = "snooze_gateway_pod_stalls_total"
"""Times each engine (pod) was found stuck: it started no answer while requests waited on it
(asleep while the operator's view says awake, frozen, or wedged). The operator then probes it
at once, asking /is_sleeping too, rather than trusting the gateway's counters."""

# -- The gateway's /idle --------------------------------------------------------------------

IDLE_PATH = "/idle"
"""Beside the metrics page, on the gateway's metrics port: `GET /idle?after=N&timeout=S`
answers with the count of engines gone idle once it is not N, or after S seconds."""
IDLE_LONGEST_WAIT = 30.0
"""The longest wait /idle grants (every waiter holds one of the port's threads); the operator
never asks for more."""
