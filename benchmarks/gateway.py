"""Benchmark: one simulated engine reached directly and through the gateway, at 1/16/64 clients."""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from typing import Any

import aiohttp
from harness import bench

SECONDS_PER_RUN = 2.0
CONCURRENCY = (1, 16, 64)
BODY = {"model": "bench", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def load(base: str, *, clients: int, stream: bool) -> dict[str, Any]:
    """`clients` loops sending back-to-back requests for SECONDS_PER_RUN; whole-answer latency."""
    latencies: list[float] = []
    body = {**BODY, "stream": stream}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        end = time.monotonic() + SECONDS_PER_RUN

        async def client() -> None:
            while time.monotonic() < end:
                began = time.monotonic()
                async with session.post(base + "/v1/chat/completions", json=body) as response:
                    await response.read()
                    assert response.status == 200, response.status
                latencies.append(time.monotonic() - began)

        began = time.monotonic()
        await asyncio.gather(*(client() for _ in range(clients)))
        elapsed = time.monotonic() - began
    return {
        "rps": len(latencies) / elapsed,
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * percentile(latencies, 0.99),
    }


async def measure(direct: str, gateway: str) -> list[dict[str, Any]]:
    rows = []
    for stream in (False, True):
        for clients in CONCURRENCY:
            await load(gateway, clients=clients, stream=stream)  # warm connections
            d = await load(direct, clients=clients, stream=stream)
            g = await load(gateway, clients=clients, stream=stream)
            rows.append(
                {
                    "stream": stream,
                    "clients": clients,
                    "direct": d,
                    "gateway": g,
                    "added_p50_ms": round(g["p50_ms"] - d["p50_ms"], 3),
                    "added_p99_ms": round(g["p99_ms"] - d["p99_ms"], 3),
                    "throughput_ratio": round(g["rps"] / d["rps"], 3),
                }
            )
            print(json.dumps(rows[-1]), file=sys.stderr)
    return rows


def main() -> None:
    with bench() as setup:
        direct = setup.engine(model="bench", token_seconds=0.002)
        # Labelled awake by hand: no operator runs here, the engine never sleeps.
        setup.pod_and_model("bench", state="awake", spec={"desiredState": "Awake"})
        gateway = setup.gateway()
        rows = asyncio.run(measure(direct, gateway))
    summary = {
        "benchmark": "gateway",
        "engine": {"token_seconds": 0.002, "max_tokens": 8},
        "seconds_per_run": SECONDS_PER_RUN,
        "results": rows,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
