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
    """Largest request body accepted (413 above it)."""
    keepalive_seconds: float = 5.0
    """Interval of the SSE comments sent to a held streaming request."""
    connect_timeout: float = 5.0
    """How long connecting to an engine may take before another pod is tried."""
    wake_recent_seconds: float = 5.0
    """A wake annotation this recent is never rewritten (another replica just asked)."""
    watch_seconds: int = 300
    """Server-side timeout of each watch; the gateway re-lists when it ends."""
