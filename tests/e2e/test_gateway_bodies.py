"""Request bodies as a hostile client sends them: compressed, nested 100,000 deep, many and
large at once. The engines here record what they received (recording_engine.py); no operator
runs, the test writes the labels and status it would (stand_in.py)."""

from __future__ import annotations

import gzip
import json
import socket
import threading
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from gateway_fixtures import GatewayThread, gateway, routable_pods, start_gateway
from recording_engine import RecordingEngine
from stand_in import write_status
from waits import wait_for

from .conftest import Cluster, _addresses

__all__ = ["gateway"]
COMPLETIONS = "/v1/completions"
PROMPT = {"model": "rec", "prompt": "a secret prompt", "max_tokens": 2}


@pytest.fixture
def recorder(cluster: Cluster) -> Iterator[RecordingEngine]:
    engine = RecordingEngine(next(_addresses)).start()
    cluster.create_pod("rec-0", labels={"app": "rec", "snooze.dev/state": "awake"})
    cluster.set_pod_ready("rec-0", engine.host, ready=True)
    cluster.create_model("rec", {"selector": {"matchLabels": {"app": "rec"}}})
    write_status(cluster, "rec", model_name="rec", pods={"rec-0": "awake"})
    yield engine
    engine.stop()


@pytest.mark.parametrize(
    ("encoding", "encode"),
    [("gzip", gzip.compress), ("deflate", zlib.compress), ("x-gzip", gzip.compress)],
)
def test_a_compressed_body_reaches_the_engine_decoded_and_labelled_as_such(
    recorder: RecordingEngine, gateway: GatewayThread, encoding: str, encode: Any
) -> None:
    wait_for("routable", lambda: routable_pods(gateway, "rec") == 1)
    plain = json.dumps(PROMPT).encode()
    answer = httpx.post(
        gateway.url + COMPLETIONS,
        content=encode(plain),
        headers={"Content-Encoding": encoding, "Content-Type": "application/json"},
    )
    assert answer.status_code == 200, answer.text
    (received,) = recorder.received
    assert received.header("Content-Encoding") == []
    assert received.body == plain
    assert received.header("Content-Length") == [str(len(plain))]


def test_an_encoding_the_gateway_cannot_read_is_refused(
    recorder: RecordingEngine, gateway: GatewayThread
) -> None:
    wait_for("routable", lambda: routable_pods(gateway, "rec") == 1)
    answer = httpx.post(
        gateway.url + COMPLETIONS,
        content=b"\x1f\x9d" + json.dumps(PROMPT).encode(),
        headers={"Content-Encoding": "compress"},
    )
    assert answer.status_code == 415
    assert "gzip" in answer.json()["error"]["message"]
    assert recorder.received == []


def test_a_compressed_bomb_stops_at_the_body_limit(
    recorder: RecordingEngine, gateway: GatewayThread
) -> None:
    wait_for("routable", lambda: routable_pods(gateway, "rec") == 1)
    bomb = gzip.compress(b'{"model": "rec", "prompt": "' + b"0" * (64 * 1024 * 1024) + b'"}')
    assert len(bomb) < 100 * 1024
    answer = httpx.post(
        gateway.url + COMPLETIONS, content=bomb, headers={"Content-Encoding": "gzip"}
    )
    assert answer.status_code == 413
    assert answer.json()["error"]["code"] == "body_too_large"
    assert recorder.received == []


@pytest.mark.parametrize("depth", [10_000, 100_000])
def test_absurd_nesting_is_a_400(
    recorder: RecordingEngine, gateway: GatewayThread, depth: int
) -> None:
    wait_for("routable", lambda: routable_pods(gateway, "rec") == 1)
    nested = b'{"model": "rec", "prompt": ' + b"[" * depth + b"]" * depth + b"}"
    answer = httpx.post(gateway.url + COMPLETIONS, content=nested)
    assert answer.status_code == 400, answer.text
    assert "nested too deeply" in answer.json()["error"]["message"]
    assert httpx.get(gateway.url + "/healthz").status_code == 200
    assert recorder.received == []


def test_bytes_buffered_in_request_bodies_are_capped(cluster: Cluster) -> None:
    """Requests held for a sleeping model keep their bodies; past the cap, 503 at once."""
    cluster.create_pod("sleepy-0", labels={"app": "sleepy", "snooze.dev/state": "asleep"})
    cluster.create_model(
        "sleepy", {"selector": {"matchLabels": {"app": "sleepy"}}, "wake": {"timeout": "5m"}}
    )
    write_status(cluster, "sleepy", model_name="sleepy", pods={"sleepy-0": "asleep"})
    megabyte = 1024 * 1024
    gw = start_gateway(max_buffered_body_bytes=3 * megabyte)
    big = {"model": "sleepy", "prompt": "x" * (megabyte + megabyte // 4)}
    try:
        wait_for("known", lambda: gw.call(lambda: gw.g.registry.resolve("sleepy").named))

        def held() -> int:
            return gw.call(lambda: sum(gw.g.holds.held.values()))

        def send(payload: dict[str, Any]) -> int:
            try:
                url = gw.url + COMPLETIONS
                return httpx.post(url, json=payload, timeout=httpx.Timeout(10, read=3)).status_code
            except httpx.ReadTimeout:
                return 0  # still held when this client gave up

        with ThreadPoolExecutor(3) as pool:
            waiting = [pool.submit(send, big) for _ in range(2)]
            wait_for("two held", lambda: held() == 2)
            refused = httpx.post(gw.url + COMPLETIONS, json=big)
            assert refused.status_code == 503
            assert refused.json()["error"]["code"] == "gateway_busy"
            assert int(refused.headers["Retry-After"]) >= 1
            small = pool.submit(send, {"model": "sleepy", "prompt": "hi"})
            wait_for("a small one still held", lambda: held() == 3)
            assert [f.result() for f in [*waiting, small]] == [0, 0, 0]
        wait_for("every held byte released", lambda: gw.call(lambda: gw.g.bodies.used) == 0)
        assert gw.call(lambda: gw.g.bodies.peak) <= 3 * megabyte
    finally:
        gw.stop()


def ints(count: int) -> bytes:
    """A large body that is cheap to send and slow to parse (an embeddings input)."""
    return b'{"model": "nobody", "input": [' + b",".join([b"0"] * count) + b"]}"


def post_raw(port: int, body: bytes, sent: threading.Barrier | None = None) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        head = (
            f"POST {COMPLETIONS} HTTP/1.1\r\nHost: g\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode()
        sock.sendall(head + body)
        if sent is not None:
            sent.wait()
        return b"".join(iter(lambda: sock.recv(65536), b""))


def test_healthz_answers_while_large_bodies_are_parsed(gateway: GatewayThread) -> None:
    """Six 4 MiB bodies whose JSON takes a fraction of a second each to parse: /healthz keeps
    answering meanwhile (parsed on the event loop, it could answer only between two parses)."""
    wait_for("ready", lambda: httpx.get(gateway.url + "/readyz").status_code == 200)
    body = ints(2 * 1024 * 1024)
    assert post_raw(gateway.port, body).startswith(b"HTTP/1.1 404")  # parsed, then routed
    sent = threading.Event()
    done = threading.Event()
    # Counting starts once every body has been handed to the network.
    all_sent = threading.Barrier(7, action=sent.set)
    answered = 0

    def probe() -> None:
        nonlocal answered
        with httpx.Client(base_url=gateway.url, timeout=30) as client:
            while not done.is_set():
                response = client.get("/healthz")
                if sent.is_set() and not done.is_set() and response.status_code == 200:
                    answered += 1

    prober = threading.Thread(target=probe)
    prober.start()
    with ThreadPoolExecutor(6) as pool:
        bodies = [pool.submit(post_raw, gateway.port, body, all_sent) for _ in range(6)]
        all_sent.wait()
        results = [f.result() for f in bodies]
    done.set()
    prober.join()
    assert all(r.startswith(b"HTTP/1.1 404") for r in results)
    assert answered >= 30, f"/healthz answered {answered} times while six bodies were parsed"


def test_a_client_supplied_forwarded_for_is_not_passed_on_as_if_trusted(
    recorder: RecordingEngine, gateway: GatewayThread
) -> None:
    """The engine gets one X-Forwarded-For whose last entry is the peer the gateway saw;
    whatever the client claimed comes before it, never alone or first on its own line."""
    wait_for("routable", lambda: routable_pods(gateway, "rec") == 1)
    body = json.dumps(PROMPT).encode()
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as sock:
        sock.sendall(
            (
                f"POST {COMPLETIONS} HTTP/1.1\r\nHost: g\r\nContent-Type: application/json\r\n"
                "X-Forwarded-For: 6.6.6.6\r\nX-Forwarded-For: 7.7.7.7, 8.8.8.8\r\n"
                "X-Real-IP: 9.9.9.9\r\nForwarded: for=5.5.5.5;proto=https\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            ).encode()
            + body
        )
        answer = b"".join(iter(lambda: sock.recv(65536), b""))
    assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
    (received,) = recorder.received
    assert received.header("X-Forwarded-For") == ["6.6.6.6, 7.7.7.7, 8.8.8.8, 127.0.0.1"]
    # One address in X-Real-IP: the peer's, never the client's claim; Forwarded ends with it.
    assert received.header("X-Real-IP") == ["127.0.0.1"]
    assert received.header("Forwarded") == ["for=5.5.5.5;proto=https, for=127.0.0.1"]
