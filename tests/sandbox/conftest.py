"""Fixtures: one sandbox per test module, and a `kubernetes` client pointing at it."""

from __future__ import annotations

from collections.abc import Iterator

import kubernetes.client
import pytest

from snooze.sandbox import Sandbox


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    with Sandbox() as sb:
        yield sb


@pytest.fixture
def client(sandbox: Sandbox) -> Iterator[kubernetes.client.ApiClient]:
    config = kubernetes.client.Configuration()
    config.host = sandbox.url
    with kubernetes.client.ApiClient(config) as api_client:
        yield api_client
