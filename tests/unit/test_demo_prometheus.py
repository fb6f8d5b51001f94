"""The demo's Prometheus, a real `prometheus` process: on a port another process took between
its choice and Prometheus's bind, it starts again on another, and answers once started."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from snooze.demo import services
from snooze.demo.services import Prometheus


@pytest.fixture
def taken() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


@pytest.mark.needs("prometheus")
def test_a_port_taken_before_prometheus_binds_it_is_chosen_again(
    taken: int, tmp_path: Path
) -> None:
    prometheus = Prometheus(targets={"job": "127.0.0.1:9"}, out=tmp_path)
    prometheus.port = taken  # as if another process bound it just after the choice
    try:
        prometheus.start()
        assert prometheus.port != taken
        assert httpx.get(prometheus.url + "/-/ready", timeout=5).status_code == 200
    finally:
        prometheus.stop()


@pytest.mark.needs("prometheus")
def test_it_says_why_when_no_port_will_do(
    taken: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(services, "free_port", lambda: taken)
    prometheus = Prometheus(targets={"job": "127.0.0.1:9"}, out=tmp_path)
    with pytest.raises(RuntimeError) as refused:
        prometheus.start()
    assert f"prometheus did not start ({services.ATTEMPTS} ports tried)" in str(refused.value)
    assert "address already in use" in str(refused.value)
