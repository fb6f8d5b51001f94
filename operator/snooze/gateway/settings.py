"""The gateway's settings, one docstring per field."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, kw_only=True)
class GatewaySettings:
    host: str = "0.0.0.0"
    """Address to listen on."""
    port: int = 8080
    """Port to listen on; 0 picks a free one."""
    namespaces: tuple[str, ...] = field(default_factory=tuple)
    """Namespaces to watch; empty: all namespaces."""
    max_held_per_model: int = 256
    """Requests held per model while it wakes; more are refused with 429 and Retry-After."""
    max_body_bytes: int = 10 * 1024 * 1024
    """Largest request body accepted (413 above it), decompressed."""
    max_buffered_body_bytes: int = 256 * 1024 * 1024
    """Bytes of request bodies the gateway holds at once, over every request being read,
    held for a wake or sent: a request that would go over gets 503 with Retry-After."""
    keepalive_seconds: float = 5.0
    """Interval of the SSE comments sent to a held streaming request."""
    connect_timeout: float = 5.0
    """How long connecting to an engine may take before another pod is tried."""
    upstream_first_byte_timeout: float = 600.0
    """How long an engine may take to send its answer's head and first chunk (a non-streamed
    answer comes whole, after the whole generation): then 504. OpenAI's client waits 600 s."""
    upstream_idle_timeout: float = 120.0
    """How long an engine may pause between two chunks of an answer: then the answer ends
    (502, or a final SSE error event)."""
    upstream_start_timeout: float = 90.0
    """How long an engine with requests waiting on it may start no answer at all (no stream's
    first event, no answer that comes whole): then it is taken as stuck (asleep, frozen), the
    requests waiting on it get 502, and it gets no request for a while (bounds/stalls.py). Longer
    than the longest prefill of one prompt with nothing else running: a 128k-token prompt
    on a 70B model takes about 4e16 FLOPs, a minute on four A100s at half their peak."""
    client_read_timeout: float = 30.0
    """How long a client may take none of an answer being sent to it (its connection's
    buffers full): then its connection is cut and its request ends, so that it no longer
    keeps its model busy (awake, and kept in its GPU pool). Well under a model's wake timeout
    (2 minutes by default), which a request waiting on that pool's room is held for."""
    client_header_timeout: float = 15.0
    """How long a client may take to send a request's line and headers, from its first byte
    (or from connecting): then 408 and the connection is closed."""
    client_body_timeout: float = 60.0
    """How long a client may take to send a whole request body: then 408."""
    expose_model_status: bool = False
    """Add Snooze's view of each model (phase, pods awake, namespace) to `/v1/models` under
    `snooze`; off, anonymous clients learn model names only."""
    wake_request_timeout: float = 5.0
    """How long writing a wake request to the API may take (retries included): then every
    request waiting on it gets 503 with Retry-After."""
    shutdown_grace_seconds: float = 30.0
    """On SIGTERM, how long requests under way (streams, held requests) may take to finish;
    the pod's terminationGracePeriodSeconds should be a little longer."""
    wake_recent_seconds: float = 5.0
    """A wake annotation this recent is never rewritten (another replica just asked)."""
    watch_seconds: int = 300
    """Server-side timeout of each watch; the gateway re-lists when it ends."""
