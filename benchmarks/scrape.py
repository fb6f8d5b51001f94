"""Benchmark: one probe's `/metrics` scrape, filtered (`name[]`, as the operator asks) vs full,
and the bytes a probe reads on each release.

One simulated engine per release with a full-size vLLM payload (histograms filled by some
traffic, the instrumentator's families of every route it was asked); each is scraped the ways
a probe could, each payload parsed with the operator's own `parse_activity`, and probed by the
operator's own Prober, whose path is read back from what the engine saw. From vLLM 0.8.5 GET
/metrics serves the whole page whatever is asked (the instrumentator's route); /metrics/
filters on every release. Reports bytes, request and parse time per probe, and their ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Callable
from functools import partial

import httpx
from harness import loopback

from snooze.engine.activity import PROBE_METRICS
from snooze.engine.client import ACTIVITY_METRICS, parse_activity
from snooze.engine.probe import Prober
from snooze.sim import EngineConfig, SimulatedEngine, SimulatorHost

FILTER = {"name[]": list(ACTIVITY_METRICS)}
RELEASES = ("0.8.4", "0.33.0")
"""The last release whose GET /metrics filters, and the default one."""


def median_seconds(action: Callable[[], object], rounds: int) -> float:
    samples = []
    for _ in range(rounds):
        began = time.perf_counter()
        action()
        samples.append(time.perf_counter() - began)
    return statistics.median(samples)


def probe(client: httpx.Client, url: str, params: dict[str, list[str]] | None) -> object:
    """A scrape, parsed: what the operator's activity probe does."""
    return parse_activity(client.get(url, params=params).text)


def serving(
    host: SimulatorHost, client: httpx.Client, version: str, requests: int
) -> tuple[SimulatedEngine, str]:
    config = EngineConfig(
        model="m",
        host=loopback(78, 2),
        port=0,
        token_seconds=0.0,
        full_metrics=True,
        vllm_version=version,
    )
    engine = host.add(config)
    url = f"http://{config.host}:{engine.port}"
    body = {"model": "m", "prompt": "hello there", "max_tokens": 8}
    for _ in range(requests):  # fill the histograms, as a serving engine's would be
        client.post(url + "/v1/completions", json=body).raise_for_status()
    client.post(url + "/v1/chat/completions", json={"model": "m", "messages": []})
    client.get(url + "/v1/models")
    return engine, url


def probed_path(engine: SimulatedEngine, url: str) -> str:
    """The path the operator's Prober reads, as the engine saw it."""

    async def twice() -> None:
        prober = Prober(limit=1, timeout=10.0)
        try:
            for _ in range(2):
                await prober.activity(url, share_known=True)
        finally:
            await prober.aclose()

    before = dict(engine.seen)
    asyncio.run(twice())
    [path] = {key.split(" ", 1)[1] for key in engine.seen if engine.seen[key] != before.get(key)}
    return path


def kinds(client: httpx.Client, url: str, rounds: int) -> dict[str, dict[str, float]]:
    """Bytes, lines, parse and probe time of each way to scrape the page."""
    ways = {
        "filtered": (url + "/metrics/", FILTER),
        "metrics_with_filter": (url + "/metrics", FILTER),
        "full": (url + "/metrics/", None),
    }
    result: dict[str, dict[str, float]] = {}
    for kind, (target, params) in ways.items():
        text = client.get(target, params=params).text
        if parse_activity(text) is None:
            raise SystemExit(f"the {kind} payload has no request gauges")
        result[kind] = {
            "bytes": len(text.encode()),
            "lines": text.count("\n"),
            "parse_ms": round(1000 * median_seconds(partial(parse_activity, text), rounds), 3),
            "probe_ms": round(
                1000 * median_seconds(partial(probe, client, target, params), rounds), 3
            ),
        }
    return result


def run(rounds: int, requests: int) -> dict[str, object]:
    out: dict[str, object] = {"benchmark": "scrape", "rounds": rounds}
    with SimulatorHost() as host, httpx.Client(timeout=10) as client:
        for version in RELEASES:
            engine, url = serving(host, client, version, requests)
            result = kinds(client, url, rounds)
            path = probed_path(engine, url)
            probe_params = {"name[]": list(PROBE_METRICS)}
            per_probe = len(client.get(url + path, params=probe_params).content)
            before = len(client.get(url + "/metrics", params=probe_params).content)
            filtered, full = result["filtered"], result["full"]
            out[version] = {
                **result,
                "operator_probe": {"path": path, "bytes": per_probe},
                "ratio_full_to_filtered": {
                    "bytes": round(full["bytes"] / filtered["bytes"], 1),
                    "parse_time": round(full["parse_ms"] / filtered["parse_ms"], 1),
                    "probe_time": round(full["probe_ms"] / filtered["probe_ms"], 1),
                },
                # A probe through GET /metrics?name[] (before Snooze learned the path) against
                # one through the path it takes now.
                "ratio_bytes_metrics_to_probe_path": round(before / per_probe, 1),
            }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200, help="timed repetitions per kind")
    parser.add_argument("--requests", type=int, default=200, help="traffic before scraping")
    args = parser.parse_args()
    print(json.dumps(run(args.rounds, args.requests)))


if __name__ == "__main__":
    main()
