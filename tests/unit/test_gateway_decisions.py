"""The gateway's pure decisions: when a wake request stands, which pod gets a request."""

from __future__ import annotations

import pytest

from snooze.gateway.hold import wake_pending
from snooze.gateway.proxy import forward_headers
from snooze.gateway.router import Router, pick
from snooze.kube.pods import PodInfo

NOW = 1000.0


@pytest.mark.parametrize(
    ("requested_at", "slept_at", "pending"),
    [
        (None, None, False),  # never asked
        (NOW - 1, None, True),  # asked a moment ago, sleep time unknown
        (NOW - 1, NOW - 10, True),  # asked after the sleep began: that wake is under way
        (NOW - 1, NOW - 0.5, False),  # the pods slept after the request: its wake is over
        (NOW - 3, NOW - 100, True),  # within `recent`, even with a tiny wake timeout
        (NOW - 200, NOW - 300, False),  # older than the wake timeout: ask again
        (NOW - 50, NOW - 300, True),  # within the wake timeout
    ],
)
def test_wake_pending(requested_at: float | None, slept_at: float | None, pending: bool) -> None:
    timeout = 2.0 if requested_at == NOW - 3 else 120.0
    result = wake_pending(
        requested_at=requested_at, slept_at=slept_at, now=NOW, wake_timeout=timeout, recent=5.0
    )
    assert result is pending


def pod(name: str) -> PodInfo:
    return PodInfo(namespace="ns", name=name, uid=name, ip="127.0.0.1", ready=True)


def test_pick_prefers_fewest_in_flight() -> None:
    pods = [pod("a"), pod("b"), pod("c")]
    in_flight = {("ns", "a"): 2, ("ns", "b"): 0, ("ns", "c"): 1}
    assert all(pick(pods, in_flight, turn).name == "b" for turn in range(5))  # type: ignore[union-attr]


def test_pick_rotates_among_equally_idle_pods() -> None:
    pods = [pod("a"), pod("b")]
    assert {pick(pods, {}, turn).name for turn in range(2)} == {"a", "b"}  # type: ignore[union-attr]
    assert pick([], {}, 0) is None


def test_router_counts_requests_in_flight() -> None:
    router = Router()
    a, b = pod("a"), pod("b")
    with router.track(a):
        assert router.choose([a, b]) == b
        with router.track(b), router.track(b):
            assert router.choose([a, b]) == a
    assert router.in_flight == {}


def test_hop_by_hop_headers_are_dropped_and_the_rest_pass() -> None:
    headers = {
        "Authorization": "Bearer t",
        "Connection": "keep-alive, X-Private",
        "X-Private": "p",
        "Keep-Alive": "timeout=5",
        "Transfer-Encoding": "chunked",
        "Host": "gateway",
        "Content-Length": "12",
        "Content-Type": "application/json",
    }
    assert dict(forward_headers(headers)) == {
        "Authorization": "Bearer t",
        "Content-Type": "application/json",
    }


def test_router_shuns_an_unreachable_pod_while_others_remain() -> None:
    router = Router()
    a, b = pod("a"), pod("b")
    router.unreachable(a)
    assert all(router.choose([a, b]) == b for _ in range(4))
    assert router.choose([a]) == a  # nothing better: try it anyway
