"""The gateway attacked from outside: raw request targets aimed at an engine's admin routes.

HTTP clients normalise dot segments and percent-escapes before sending, so these requests go
out as raw bytes over a socket, exactly as an attacker would write them; the assertions are
on what the engine saw, not only on the status code.
"""

from __future__ import annotations

import json
import logging
import socket
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from gateway_fixtures import GatewayThread, gateway
from stand_in import set_label
from waits import wait_for

from .conftest import Cluster, OperatorThread
from .test_gateway import MESSAGES, add_model, client, gateway_view

__all__ = ["gateway"]

ADMIN = ("sleep?level=2&mode=abort", "wake_up?tags=weights", "collective_rpc", "reset_prefix_cache")
# Spellings of "the parent of /v1", each of which some HTTP stack resolves to the root.
TRAVERSALS = (
    "/v1/../{admin}",
    "/v1/./../{admin}",
    "/v1/%2e%2e/{admin}",
    "/v1/%2E%2E/{admin}",
    "/v1/.%2e/{admin}",
    "/v1/%2e./{admin}",
    "/v1/chat/../../{admin}",
    "/v1/chat/completions/../../../{admin}",
    "/v1/..%2f{admin}",
    "/v1/%2e%2e%2f{admin}",
    "/v1/%252e%252e/{admin}",
    "/v1/..\\{admin}",
    "/v1/%5c..%5c{admin}",
    "//{admin}",
    "/v1//../{admin}",
    "/v1/chat/completions/..;/../../{admin}",
    "/{admin}",
    "/v1/{admin}",
    "http://engine:8000/{admin}",
)
CORPUS = [t.format(admin=a) for t in TRAVERSALS for a in ADMIN]
ADMIN_SEEN = ("POST /sleep", "POST /wake_up", "POST /collective_rpc", "POST /reset_prefix_cache")


def raw_request(port: int, method: str, target: str, body: bytes) -> tuple[int, bytes]:
    """Send one request exactly as written; return the status code and the body."""
    head = (
        f"{method} {target} HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head + body)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    answer = b"".join(chunks)
    status_line, _, rest = answer.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


def test_admin_routes_are_never_reached_through_the_gateway(
    cluster: Cluster, operator: OperatorThread, gateway: GatewayThread
) -> None:
    (engine,) = add_model(cluster, "victim", spec={"idle": {"after": "1h"}})
    wait_for("victim awake", lambda: gateway_view(gateway, "victim").get("awake") == 1)
    body = json.dumps(
        {"model": "victim", "method": "reload_weights", "messages": MESSAGES, "prompt": "x"}
    ).encode()

    answers = {}
    for target in CORPUS:
        for method in ("POST", "GET"):
            status, payload = raw_request(gateway.port, method, target, body)
            answers[(method, target)] = status
            assert status in (400, 404, 405), (method, target, status, payload[:200])
            error = json.loads(payload)["error"]  # OpenAI's shape, never aiohttp's text
            assert error["message"], (method, target)

    assert not [k for k in engine.seen if k in ADMIN_SEEN], engine.seen
    assert (engine.sleep_calls, engine.wake_calls) == (0, 0)
    assert not engine.is_sleeping and engine.weights_valid
    # The same socket code does reach the engine through an allowed path: the corpus was sent.
    status, payload = raw_request(gateway.port, "POST", "/v1/chat/completions", body)
    assert status == 200, payload
    assert engine.seen["POST /v1/chat/completions"] == 1
    assert client(gateway).models.retrieve("victim").id == "victim"


@pytest.mark.parametrize(
    "target", ["/v1/chat/completions?x=/../sleep", "/v1/completions?level=2&mode=abort"]
)
def test_a_query_string_goes_only_to_the_allowed_path(
    cluster: Cluster, operator: OperatorThread, gateway: GatewayThread, target: str
) -> None:
    (engine,) = add_model(cluster, "q", spec={"idle": {"after": "1h"}})
    wait_for("q awake", lambda: gateway_view(gateway, "q").get("awake") == 1)
    body = json.dumps({"model": "q", "messages": MESSAGES, "prompt": "x"}).encode()
    status, _ = raw_request(gateway.port, "POST", target, body)
    assert status == 200
    assert not [k for k in engine.seen if k in ADMIN_SEEN]
    assert engine.sleep_calls == 0


def test_unknown_routes_and_methods_get_openai_shaped_errors(gateway: GatewayThread) -> None:
    wait_for("ready", lambda: httpx.get(gateway.url + "/readyz").status_code == 200)
    missing = httpx.post(gateway.url + "/v1/files", json={"model": "x"})
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "unknown_route"
    wrong = httpx.get(gateway.url + "/v1/chat/completions")
    assert wrong.status_code == 405
    assert wrong.headers["Allow"] == "POST"
    assert wrong.json()["error"]["type"] == "invalid_request_error"


def test_an_asleep_pod_labelled_awake_by_its_owner_gets_no_request(
    cluster: Cluster, operator: OperatorThread, gateway: GatewayThread
) -> None:
    """A pod's owner labels an asleep pod `awake`; requests sent while the gateway sees that
    label (until the operator puts it back) go only to the pod the operator reports awake."""
    engines = add_model(cluster, "guarded", pods=2, spec={"minAwake": 1})
    names = ["guarded-0", "guarded-1"]
    wait_for(
        "one asleep, one awake",
        lambda: sorted(str(cluster.pod_state(n)) for n in names) == ["asleep", "awake"],
    )
    wait_for("the gateway sees one awake", lambda: gateway_view(gateway, "guarded")["awake"] == 1)
    sleeper_name = next(n for n in names if cluster.pod_state(n) == "asleep")
    sleeper = engines[names.index(sleeper_name)]

    def ask(_: int) -> int:
        body = {"model": "guarded", "messages": MESSAGES, "max_tokens": 2}
        try:
            return httpx.post(
                gateway.url + "/v1/chat/completions", json=body, timeout=5
            ).status_code
        except httpx.TimeoutException:
            return 0

    with ThreadPoolExecutor(4) as pool:
        set_label(cluster, sleeper_name, "awake")
        codes = list(pool.map(ask, range(40)))
    wait_for(
        "the operator to put the label back", lambda: cluster.pod_state(sleeper_name) == "asleep"
    )
    assert sleeper.seen["POST /v1/chat/completions"] == 0, codes
    # All it served is the operator's record of its answer, before its first sleep.
    assert sleeper.requests_served == sleeper.seen["POST /v1/completions"] == 2
    assert codes == [200] * 40


def raw_exchange(port: int, data: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send bytes as they are; the status, headers and body of the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body


MALFORMED = {
    "a header of 10,000 bytes": (
        b"POST /v1/completions HTTP/1.1\r\nHost: g\r\nX-Big: " + b"a" * 10000 + b"\r\n\r\n",
        431,
    ),
    "a request line of 10,000 bytes": (b"GET /v1/" + b"a" * 10000 + b" HTTP/1.1\r\n\r\n", 431),
    "300 headers": (
        b"GET /healthz HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(300)) + b"\r\n",
        431,
    ),
    "not HTTP": (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 hello\r\n\r\n", 400),
    "a bad Content-Length": (b"POST /v1/completions HTTP/1.1\r\nContent-Length: abc\r\n\r\n", 400),
    "a bad method": (b"G@T /healthz HTTP/1.1\r\n\r\n", 400),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_requests_that_are_not_http_get_openai_shaped_errors_and_no_traceback(
    gateway: GatewayThread, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    data, expected = MALFORMED[case]
    caplog.set_level(logging.DEBUG)
    status, headers, body = raw_exchange(gateway.port, data)
    assert status == expected, body[:200]
    assert headers["Content-Type"].startswith("application/json")
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
