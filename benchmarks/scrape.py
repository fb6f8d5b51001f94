"""Benchmark: one probe's `/metrics` scrape, filtered (`name[]`, as the operator asks) vs full.

One simulated engine with a full-size vLLM payload (histograms filled by some traffic); the
same engine is scraped both ways, alternately, and each payload parsed with the operator's
own `parse_activity`. Reports bytes, request and parse time per probe, and their ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from functools import partial

import httpx

from snooze.engine.client import ACTIVITY_METRICS, parse_activity
from snooze.sim import EngineConfig, SimulatorHost

HOST = "127.0.78.2"
FILTER = {"name[]": list(ACTIVITY_METRICS)}


def median_seconds(action: Callable[[], object], rounds: int) -> float:
    samples = []
    for _ in range(rounds):
        began = time.perf_counter()
        action()
        samples.append(time.perf_counter() - began)
    return statistics.median(samples)


def probe(client: httpx.Client, url: str, params: dict[str, list[str]] | None) -> object:
    """What the operator's activity probe does: one scrape, parsed."""
    return parse_activity(client.get(url + "/metrics", params=params).text)


def run(rounds: int, requests: int) -> dict[str, object]:
    config = EngineConfig(model="m", host=HOST, port=8000, token_seconds=0.0, full_metrics=True)
    with SimulatorHost() as host, httpx.Client(timeout=10) as client:
        engine = host.add(config)
        url = f"http://{HOST}:{engine.port}"
        body = {"model": "m", "prompt": "hello there", "max_tokens": 8}
        for _ in range(requests):  # fill the histograms, as a serving engine's would be
            client.post(url + "/v1/completions", json=body).raise_for_status()
        # What goes over the wire: httpx asks for gzip, which the simulator does not serve.
        payloads = {
            "filtered": client.get(url + "/metrics", params=FILTER),
            "full": client.get(url + "/metrics"),
        }
        result: dict[str, dict[str, float]] = {}
        for kind, response in payloads.items():
            text = response.text
            snapshot = parse_activity(text)
            if snapshot is None:
                raise SystemExit(f"the {kind} payload has no request gauges")
            params = FILTER if kind == "filtered" else None
            result[kind] = {
                "bytes": len(response.content),
                "lines": text.count("\n"),
                "parse_ms": 1000 * median_seconds(partial(parse_activity, text), rounds),
                "probe_ms": 1000 * median_seconds(partial(probe, client, url, params), rounds),
            }
    filtered, full = result["filtered"], result["full"]
    return {
        "benchmark": "scrape",
        "rounds": rounds,
        "filtered": {k: round(v, 3) for k, v in filtered.items()},
        "full": {k: round(v, 3) for k, v in full.items()},
        "ratio_full_to_filtered": {
            "bytes": round(full["bytes"] / filtered["bytes"], 1),
            "parse_time": round(full["parse_ms"] / filtered["parse_ms"], 1),
            "probe_time": round(full["probe_ms"] / filtered["probe_ms"], 1),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200, help="timed repetitions per kind")
    parser.add_argument("--requests", type=int, default=200, help="traffic before scraping")
    args = parser.parse_args()
    print(json.dumps(run(args.rounds, args.requests)))


if __name__ == "__main__":
    main()
