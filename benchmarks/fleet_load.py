"""The fleet benchmark's instruments: CPU and memory of a process from /proc, a pod watch
that times each state label's changes, and the traffic (to the engines or to the gateway)."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import statistics
import threading
import time
from pathlib import Path

import aiohttp
import httpx

NS = "default"
STATE = "snooze.dev/state"
TICK = os.sysconf("SC_CLK_TCK")
MAX_TRIES = 100  # per request: Retry-After 2 s, so about 200 s


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far, from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def memory_mb(pid: int) -> tuple[float, float]:
    """(resident now, peak resident) in MB, from /proc/PID/status."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) / 1024
    return values["VmRSS"], values["VmHWM"]


def percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p99": None, "max": None}
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {
        "p50": round(statistics.median(ordered), 3),
        "p99": round(p99, 3),
        "max": round(ordered[-1], 3),
    }


class PodStates:
    """A watch on pods in a thread: when each pod's state label last changed, and to what."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.state: dict[str, str | None] = {}
        self.since: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def summary(self) -> dict[str, int]:
        return dict(collections.Counter(str(v) for v in list(self.state.values())))

    def count(self, state: str) -> int:
        return sum(1 for value in list(self.state.values()) if value == state)

    def _run(self) -> None:
        params = {"watch": "true", "timeoutSeconds": "3600"}
        path = f"{self.url}/api/v1/namespaces/{NS}/pods"
        with httpx.stream("GET", path, params=params, timeout=None) as stream:
            for line in stream.iter_lines():
                if self._stop.is_set():
                    return
                if not line:
                    continue
                meta = json.loads(line)["object"]["metadata"]
                name = meta["name"]
                state = (meta.get("labels") or {}).get(STATE)
                if self.state.get(name, "-") != state:
                    self.state[name] = state
                    self.since[name] = time.time()


class Traffic:
    """One tiny completion per target every `period` seconds, staggered, in a thread's loop.

    A target is (completions URL, model, key): an engine's own URL (traffic straight to the
    engines, keyed by engine address), or the gateway's, by model (keyed by slot; the gateway
    spreads a model's requests over its engines and its counters say which served when)."""

    def __init__(
        self, targets: list[tuple[str, str, str]], period: float, timeout: float = 5.0
    ) -> None:
        self.targets = targets
        self.period = period
        self.timeout = timeout
        self.last_end: dict[str, float] = {}
        self.errors = 0
        self.failures: collections.Counter[str] = collections.Counter()
        """Failed requests by status and error code, or by exception."""
        self.retried: collections.Counter[str] = collections.Counter()
        """503s with Retry-After that were tried again, by error code."""
        self.sent = 0
        self._stopping = False
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def start(self) -> None:
        self._thread.start()

    def absorb(self, earlier: Traffic) -> None:
        """Count an earlier, stopped traffic's requests and failures as this one's."""
        self.sent += earlier.sent
        self.errors += earlier.errors
        self.failures.update(earlier.failures)
        self.retried.update(earlier.retried)

    def stop(self) -> None:
        self._stopping = True
        self._thread.join(self.period + 30)

    async def _main(self) -> None:
        connector = aiohttp.TCPConnector(limit=400)
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            count = len(self.targets)
            await asyncio.gather(
                *(
                    self._target(session, *target, self.period * i / count)
                    for i, target in enumerate(self.targets)
                )
            )

    async def _target(
        self, session: aiohttp.ClientSession, url: str, model: str, key: str, offset: float
    ) -> None:
        await asyncio.sleep(offset)
        body = {"model": model, "prompt": "hi", "max_tokens": 1}
        tries = 0
        while not self._stopping:
            began = time.monotonic()
            tries += 1
            try:
                async with session.post(url, json=body) as reply:
                    answer = await reply.read()
                    retry_after = reply.headers.get("Retry-After")
                if reply.status == 200:
                    self.last_end[key] = time.time()
                elif reply.status == 503 and retry_after and tries < MAX_TRIES:
                    # As OpenAI's clients do: a 503 with Retry-After is tried again (here:
                    # a model whose name the operator has not yet claimed, at startup).
                    self.retried[error_code(answer)] += 1
                    await asyncio.sleep(float(retry_after))
                    continue
                else:
                    self.errors += 1
                    self.failures[f"{reply.status} {error_code(answer)}"] += 1
            except (aiohttp.ClientError, TimeoutError) as exc:
                self.errors += 1
                self.failures[type(exc).__name__] += 1
            self.sent += 1
            tries = 0
            await asyncio.sleep(max(0.0, self.period - (time.monotonic() - began)))


def error_code(answer: bytes) -> str:
    """The OpenAI-shaped error's code, if the answer is one."""
    try:
        return str(json.loads(answer)["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return "?"
