"""The gateway's scenes of hostile.py, each beside its control in the same run, against a
`snooze gateway` process (its memory read from /proc/PID/status) and a `snooze operator`
process that reads the gateway's page, as the chart has it:

- huge: an answer of 300 MB, not streamed (an engine stand-in of hostile_engines.py), against
  ordinary ones: the gateway's peak resident memory, and another model's requests meanwhile;
- unread: a stream whose client never reads (a socket with a 4 KiB receive buffer), against
  one whose client reads for a second and leaves: seconds from each stream's start until its
  model (`idle.after: 1s`) sleeps;
- lying: an engine whose metrics say awake and which starts no answer, with
  `--upstream-start-timeout 2s`: seconds to a stream's 502, to an answer that comes whole's
  (judged by the gateway's own one-token stream), and to the next request's, against a
  healthy engine's answer; before, each waited out the first-byte timeout (600 s);
- flood: 300 idle connections opened at once to the gateway's metrics port: how many of them
  it closed, how soon, and a scrape right after, against one after 56 idle connections.

Usage: python hostile_gateway.py [--huge-mb 300]   (hostile.py runs it too)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
from harness import NS, Bench, bench, free_port, loopback, wait_until

ENGINES = Path(__file__).with_name("hostile_engines.py")
HONEST = 'vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:engine_sleep_state{sleep_state="awake"} 1\n'  # noqa: E501
MESSAGES = [{"role": "user", "content": "hello"}]
MIB = 1 << 20
START_TIMEOUT = 2.0
READ_TIMEOUT = 1.0
PODS = f"/api/v1/namespaces/{NS}/pods"


class Gateway:
    """The gateway process: its URLs, its memory."""

    def __init__(self, setup: Bench) -> None:
        self.metrics_port = free_port()
        self.url = setup.gateway(
            self.metrics_port,
            extra=(
                "--client-read-timeout", f"{READ_TIMEOUT:g}s",
                "--upstream-start-timeout", f"{START_TIMEOUT:g}s",
            ),
        )  # fmt: skip
        self.pid = setup.procs[-1].pid
        self.metrics = f"http://127.0.0.1:{self.metrics_port}/metrics"

    def peak(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmHWM")

    def reset_peak(self) -> None:
        Path(f"/proc/{self.pid}/clear_refs").write_text("5")

    def chat(self, model: str, *, stream: bool = False, tokens: int = 4) -> tuple[int, float]:
        body = {"model": model, "messages": MESSAGES, "max_tokens": tokens, "stream": stream}
        began = time.monotonic()
        code = httpx.post(self.url + "/v1/chat/completions", json=body, timeout=60).status_code
        return code, time.monotonic() - began

    def awake(self, model: str) -> bool:
        for entry in httpx.get(self.url + "/v1/models").json()["data"]:
            if entry["id"] == model:
                return bool(entry["snooze"]["awake"])
        return False


def pod_state(setup: Bench, pod: str) -> str | None:
    labels = setup.api.get(f"{PODS}/{pod}").json()["metadata"].get("labels") or {}
    state: str | None = labels.get("snooze.dev/state")
    return state


def hostile(setup: Bench, control: str, name: str, host: str, **answer: Any) -> None:
    """A model whose one pod is a hostile engine: metrics that say awake and idle, and the
    inference answers `answer` says."""
    body = {"host": host, "kind": "page", "text": HONEST, **answer}
    httpx.post(control, json=body).raise_for_status()
    setup.pod_and_model(name, state=None, spec={"idle": {"after": "10m"}}, host=host)


def huge(setup: Bench, gateway: Gateway, size: int) -> dict[str, Any]:
    for _ in range(5):
        gateway.chat("calm")
    gateway.reset_peak()
    control = [gateway.chat("calm")[1] for _ in range(10)]
    control_peak = gateway.peak()

    got: dict[str, Any] = {}

    def read() -> None:
        body = {"model": "huge", "prompt": "everything", "max_tokens": 10**6}
        began = time.monotonic()
        with httpx.stream("POST", gateway.url + "/v1/completions", json=body, timeout=60) as r:
            got["code"] = r.status_code
            got["bytes"] = sum(len(chunk) for chunk in r.iter_raw(MIB))
        got["seconds"] = time.monotonic() - began

    gateway.reset_peak()
    reader = threading.Thread(target=read)
    reader.start()
    meanwhile = []
    while reader.is_alive():
        meanwhile.append(gateway.chat("calm"))
    reader.join()
    peak = gateway.peak()
    return {
        "control_peak_mib": round(control_peak / MIB, 1),
        "peak_mib": round(peak / MIB, 1),
        "ratio": round(peak / control_peak, 2),
        "answer": {"code": got["code"], "mb": got["bytes"] / 1e6, "s": round(got["seconds"], 2)},
        "others": {
            "served": sum(1 for code, _ in meanwhile if code == 200),
            "failed": sum(1 for code, _ in meanwhile if code != 200),
            "p50_ms": round(1000 * statistics.median(s for _, s in meanwhile), 1),
            "control_p50_ms": round(1000 * statistics.median(control), 1),
        },
    }


def unread_socket(gateway: Gateway, model: str) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", int(gateway.url.rsplit(":", 1)[1])))
    body = json.dumps({"model": model, "messages": MESSAGES, "max_tokens": 10**5,
                       "stream": True}).encode()  # fmt: skip
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json"
        b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    return sock


def in_flight(gateway: Gateway, pod: str) -> float:
    for line in httpx.get(gateway.metrics).text.splitlines():
        if line.startswith("snooze_gateway_pod_requests_in_flight{") and f'pod="{pod}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def asleep_after_stream(
    setup: Bench, gateway: Gateway, name: str, client: Callable[[], Any]
) -> float:
    """Seconds from the stream's start (the gateway counts it in flight) to its model asleep;
    the request wakes the model first if it already slept."""
    failed: list[BaseException] = []

    def ask(stack: contextlib.ExitStack) -> None:
        try:
            stack.enter_context(client())
        except BaseException as exc:  # told by the main thread
            failed.append(exc)

    with contextlib.ExitStack() as stack:
        thread = threading.Thread(target=ask, args=(stack,), daemon=True)
        thread.start()
        wait_until(f"{name} streaming", lambda: in_flight(gateway, f"{name}-0") == 1 or failed, 60)
        began = time.monotonic()
        wait_until(f"{name} asleep", lambda: pod_state(setup, f"{name}-0") == "asleep", 120)
        slept = time.monotonic() - began
        thread.join(30)
    if failed:
        raise SystemExit(f"the client of {name} failed: {failed[0]!r}")
    return slept


@contextlib.contextmanager
def reading(gateway: Gateway, model: str, seconds: float) -> Iterator[None]:
    """A client that reads its stream for `seconds`, then leaves."""
    body = {"model": model, "messages": MESSAGES, "max_tokens": 10**5, "stream": True}
    until = time.monotonic() + seconds
    with httpx.stream("POST", gateway.url + "/v1/chat/completions", json=body, timeout=60) as r:
        r.raise_for_status()
        for _ in r.iter_raw():
            if time.monotonic() >= until:
                break
    yield


def unread(setup: Bench, gateway: Gateway) -> dict[str, Any]:
    control = asleep_after_stream(setup, gateway, "reader", lambda: reading(gateway, "reader", 1))
    stalled = asleep_after_stream(
        setup, gateway, "unread", lambda: unread_socket(gateway, "unread")
    )
    return {
        "read_timeout_s": READ_TIMEOUT,
        "control_asleep_s": round(control, 2),
        "unread_asleep_s": round(stalled, 2),
        "ratio": round(stalled / control, 2),
    }


def lying(gateway: Gateway) -> dict[str, Any]:
    control = statistics.median(gateway.chat("calm", stream=True)[1] for _ in range(5))
    stream_code, stream_s = gateway.chat("liar", stream=True)
    next_code, next_s = gateway.chat("liar", stream=True)
    whole_code, whole_s = gateway.chat("liar-whole")
    return {
        "start_timeout_s": START_TIMEOUT,
        "before_s": 600.0,
        "stream": {"code": stream_code, "s": round(stream_s, 2)},
        "whole": {"code": whole_code, "s": round(whole_s, 2)},
        "next": {"code": next_code, "s": round(next_s, 3)},
        "control_s": round(control, 3),
    }


def closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def flood(gateway: Gateway, count: int) -> tuple[float, int, float]:
    """`count` idle connections begun at once: a scrape's seconds right after, how many the
    port closed within 3 s, and how soon the last of those was."""
    sockets = []
    began = time.monotonic()
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", gateway.metrics_port))
            sockets.append(sock)
        asked = time.monotonic()
        httpx.get(gateway.metrics, timeout=60).raise_for_status()
        scrape = time.monotonic() - asked
        shed, shed_at = 0, 0.0
        while time.monotonic() < began + 3:
            now = sum(closed_by_server(s) for s in sockets)
            if now > shed:
                shed, shed_at = now, time.monotonic() - began
            time.sleep(0.02)
        return scrape, shed, shed_at
    finally:
        for sock in sockets:
            sock.close()


def floods(gateway: Gateway) -> dict[str, Any]:
    control, _, _ = flood(gateway, 56)
    scrape, shed, shed_at = flood(gateway, 300)
    return {
        "connections": 300,
        "shed": shed,
        "shed_within_s": round(shed_at, 2),
        "scrape_s": round(scrape, 3),
        "control_scrape_s": round(control, 3),
        "ratio": round(scrape / control, 2),
    }


def scenes(huge_mb: int) -> dict[str, Any]:
    """Every scene, in a sandbox of its own; the figures as a dict."""
    with bench() as setup:
        setup.install_crd()
        port = free_port()
        setup.spawn(str(ENGINES), "--control-port", str(port))
        control = f"http://127.0.0.1:{port}/engines"
        wait_until("the hostile engines", lambda: httpx.get(control).status_code == 200)
        engines = {"calm": loopback(81, 2), "reader": loopback(81, 3), "unread": loopback(81, 4)}
        for name, host in engines.items():
            slow = name != "calm"
            setup.engine(model=name, host=host, token_seconds=0.0005 if slow else 0.002)
            spec = {"idle": {"after": "1s" if slow else "10m"}}
            setup.pod_and_model(name, state=None, spec=spec, host=host)
        hostile(setup, control, "huge", loopback(81, 10), answer="huge",
                bytes=huge_mb * 1_000_000, length=True)  # fmt: skip
        hostile(setup, control, "liar", loopback(81, 11), answer="silent")
        hostile(setup, control, "liar-whole", loopback(81, 12), answer="silent")
        gateway = Gateway(setup)
        metrics = f"http://127.0.0.1:{gateway.metrics_port}/metrics"
        setup.spawn("-m", "snooze.cli", "operator", "--probe-interval", "0.5",
                    "--gateway-metrics", metrics)  # fmt: skip
        for name in ("calm", "huge", "liar", "liar-whole"):
            wait_until(f"{name} awake", lambda n=name: gateway.awake(n), 120)
        for name in ("reader", "unread"):  # served by the operator (awake, or asleep already)
            wait_until(f"{name} served", lambda n=name: pod_state(setup, f"{n}-0"), 120)
        return {
            "huge": huge(setup, gateway, huge_mb * 1_000_000),
            "unread": unread(setup, gateway),
            "lying": lying(gateway),
            "flood": floods(gateway),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--huge-mb", type=int, default=300, help="the huge answer's size")
    args = parser.parse_args()
    print(json.dumps({"benchmark": "hostile_gateway", **scenes(args.huge_mb)}))


if __name__ == "__main__":
    main()
