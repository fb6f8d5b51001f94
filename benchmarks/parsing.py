"""Benchmark: /healthz latency while large request bodies are parsed, against an idle gateway.

Six clients each send 4 MiB JSON bodies (an embeddings-style array of numbers, slow to
parse) in a loop, while a seventh asks /healthz; the ratio of the two /healthz medians says
how much the parsing holds the event loop. Usage: python benchmarks/parsing.py
"""

from __future__ import annotations

import json
import socket
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from harness import bench

SECONDS = 4.0
CLIENTS = 6
BODY = b'{"model": "nobody", "input": [' + b",".join([b"0"] * (2 * 1024 * 1024)) + b"]}"


def post(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        head = (
            "POST /v1/embeddings HTTP/1.1\r\nHost: g\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(BODY)}\r\nConnection: close\r\n\r\n"
        ).encode()
        sock.sendall(head + BODY)
        while sock.recv(65536):
            pass


def healthz_ms(url: str, seconds: float) -> list[float]:
    samples = []
    deadline = time.monotonic() + seconds
    with httpx.Client(base_url=url, timeout=30) as client:
        while time.monotonic() < deadline:
            began = time.perf_counter()
            client.get("/healthz").raise_for_status()
            samples.append(1000 * (time.perf_counter() - began))
    return samples


def main() -> None:
    with bench() as setup:
        setup.install_crd()
        url = setup.gateway()
        port = int(url.rsplit(":", 1)[1])
        post(port)  # the parsing workers start on the first large body
        idle = healthz_ms(url, SECONDS)
        stop = threading.Event()
        sent = 0

        def load() -> None:
            nonlocal sent
            while not stop.is_set():
                post(port)
                sent += 1

        with ThreadPoolExecutor(CLIENTS) as pool:
            for _ in range(CLIENTS):
                pool.submit(load)
            busy = healthz_ms(url, SECONDS)
            stop.set()
    p50_idle, p50_busy = statistics.median(idle), statistics.median(busy)
    print(
        json.dumps(
            {
                "benchmark": "parsing",
                "body_bytes": len(BODY),
                "clients": CLIENTS,
                "bodies_parsed": sent,
                "healthz_p50_ms_idle": round(p50_idle, 2),
                "healthz_p50_ms_while_parsing": round(p50_busy, 2),
                "healthz_p99_ms_while_parsing": round(statistics.quantiles(busy, n=100)[98], 2),
                "ratio_p50": round(p50_busy / p50_idle, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
