"""The gateway for end-to-end tests: served from its own thread and loop, so tests may block."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from snooze.gateway.embedded import GatewayThread
from snooze.gateway.settings import GatewaySettings
from snooze.sandbox import Sandbox

# Short keepalives, so that a test sees SSE comments without waiting long; the model status
# in /v1/models, which the tests read to see what the gateway sees.
TEST_SETTINGS = GatewaySettings(
    host="127.0.0.1", port=0, keepalive_seconds=0.2, expose_model_status=True
)


def start_gateway(**overrides: Any) -> GatewayThread:
    return GatewayThread(replace(TEST_SETTINGS, **overrides)).start()


@pytest.fixture
def gateway(sandbox: Sandbox) -> Iterator[GatewayThread]:
    thread = start_gateway()
    yield thread
    thread.stop()


def routable_pods(gw: GatewayThread, model_name: str) -> int:
    """How many pods the gateway would send a request for `model_name` to now."""

    def count() -> int:
        holder = gw.g.registry.resolve(model_name).holder
        return 0 if holder is None else len(gw.g.registry.awake_pods(holder))

    return gw.call(count)
