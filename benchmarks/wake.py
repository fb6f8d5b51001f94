"""Benchmark: time to first byte for a request to a sleeping model, minus the engine's wake time."""

from __future__ import annotations

import json
import statistics
import time

import httpx
from harness import Bench, bench

WAKE_SECONDS = 0.3
KV_WAKE_SECONDS = 0.05  # the simulator's default, part of every wake
ROUNDS = 5
BODY = {"model": "wake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def first_data_seconds(url: str, model: str = "wake") -> float:
    """Seconds until the first `data:` line (the gateway's waiting comments do not count)."""
    began = time.monotonic()
    body = {**BODY, "model": model, "stream": True}
    with httpx.stream("POST", url, json=body, timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith("data:"):
                return time.monotonic() - began
    raise SystemExit("the stream ended without data")


def awake_count(gateway: str) -> int:
    listing = httpx.get(gateway + "/v1/models").json()
    return int(next(m["snooze"]["awake"] for m in listing["data"] if m["id"] == "wake"))


def pod_state(setup: Bench) -> str | None:
    pod = setup.api.get("/api/v1/namespaces/default/pods/wake-0").json()
    state: str | None = (pod["metadata"].get("labels") or {}).get("snooze.dev/state")
    return state


def main() -> None:
    with bench() as setup:
        setup.engine(model="wake", token_seconds=0.002, wake_seconds=WAKE_SECONDS)
        setup.pod_and_model("wake", state=None, spec={"idle": {"after": "1s"}})
        setup.operator()
        gateway = setup.gateway()
        url = gateway + "/v1/chat/completions"
        samples = []
        for _ in range(ROUNDS):
            deadline = time.monotonic() + 30
            while not (pod_state(setup) == "asleep" and awake_count(gateway) == 0):
                if time.monotonic() > deadline:
                    raise SystemExit("the model did not fall asleep")
                time.sleep(0.05)
            samples.append(first_data_seconds(url) - WAKE_SECONDS - KV_WAKE_SECONDS)
    print(
        json.dumps(
            {
                "benchmark": "wake",
                "engine_wake_seconds": WAKE_SECONDS + KV_WAKE_SECONDS,
                "rounds": ROUNDS,
                "overhead_ms": [round(1000 * s, 1) for s in samples],
                "overhead_p50_ms": round(1000 * statistics.median(samples), 1),
                "overhead_max_ms": round(1000 * max(samples), 1),
            }
        )
    )


if __name__ == "__main__":
    main()
