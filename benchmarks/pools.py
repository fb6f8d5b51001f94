"""Benchmark: N models sharing P GPU pools under a skewed, bursty trace, against one always-on GPU
per model.

Every request of the trace goes, at the same instant, to two copies of its model through one
gateway: the pooled one (an engine on one of the P shared simulated devices, put to sleep and
woken by the operator's pool) and the baseline one (an engine of its own, always awake). The
added latency of a request is the pooled copy's time to first token minus the baseline's.

Processes: this one runs the sandbox API, the simulated engines (so that each engine's refused
starts and out-of-memory wakes are read from the engine itself) and the traffic; the operator
(`snooze operator`, its /metrics scraped for evictions) and the gateway run on their own.

Time: the trace and every engine delay (sleep 5.7 s, wake 0.3 s, tokens, a container's start)
are divided by `--time-scale`; figures are given back in trace seconds (wall x scale). The
operator's, the gateway's and the API's own delays are not scaled, so in trace seconds they
count `--time-scale` times: the added latencies are upper bounds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx
from harness import NS, bench, free_port, wait_until
from pool_cluster import (
    ASLEEP_GIB,
    DRIFT_INTERVAL,
    KV_WAKE_SECONDS,
    LIMIT,
    PROBE_INTERVAL,
    SLEEP_SECONDS,
    WAKE_SECONDS,
    Cluster,
    footprints,
    forced_over_limit,
    percentiles,
    pool_fits,
    trace_for,
)
from pool_trace import Request, oversubscribed
from prometheus_client.parser import text_string_to_metric_families

from snooze.api.durations import DurationError, parse_duration
from snooze.operator.metrics import POOL_EVICTION_REASONS as EVICTION_REASONS
from snooze.sim import EngineConfig, SimulatorHost


def progress(message: str) -> None:
    print(f"pools: {time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


@dataclass
class Outcome:
    """One request as the client saw it."""

    ok: bool = False
    first_token: float | None = None
    """Seconds (wall) from sending to the first `data:` line."""
    error: str = ""


@dataclass
class Pair:
    request: Request
    state: str
    """The pooled engine when the request was sent: awake, asleep-room (a wake is enough),
    asleep-full (room must be made first), sleeping or waking."""
    sent: float = 0.0
    """When it was sent (seconds since the epoch, wall)."""
    pooled: Outcome = field(default_factory=Outcome)
    baseline: Outcome = field(default_factory=Outcome)

    @property
    def added(self) -> float:
        """The pooled copy's time to first token beyond the baseline's (both answered)."""
        assert self.pooled.first_token is not None and self.baseline.first_token is not None
        return self.pooled.first_token - self.baseline.first_token


def scrape(url: str) -> dict[str, float]:
    """The operator's metrics that this benchmark reads, summed over their labels but one."""
    text = httpx.get(url, timeout=10).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name, labels = sample.name, sample.labels
            if name == "snooze_pool_evictions_total":
                key = f"evictions_{labels['reason']}"
            elif name.startswith(("snooze_pool_oom_total", "snooze_pool_wait_seconds_")):
                if name.endswith(("_bucket", "_created")):
                    continue
                key = name
            elif name.startswith(("snooze_wake_duration_seconds", "snooze_sleep_duration_seconds")):
                # Wakes are per model (the benchmark's are m0, m1, ...); sleeps are per
                # namespace only, and the benchmark's models are all that run in NS.
                mine = labels.get("model", "").startswith("m") or labels.get("namespace") == NS
                if not mine or name.endswith(("_bucket", "_created")):
                    continue
                key = name
            else:
                continue
            out[key] = out.get(key, 0.0) + sample.value
    return out


async def ask(session: aiohttp.ClientSession, url: str, model: str, tokens: int) -> Outcome:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": tokens,
        "stream": True,
    }
    outcome = Outcome()
    began = time.monotonic()
    got = 0
    try:
        async with session.post(url, json=body) as response:
            if response.status != 200:
                outcome.error = f"HTTP {response.status}"
                return outcome
            async for raw in response.content:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue  # the gateway's comments while it holds the request
                if outcome.first_token is None:
                    outcome.first_token = time.monotonic() - began
                data = line[5:].strip()
                if data == "[DONE]":
                    outcome.ok = got == tokens
                    if not outcome.ok:
                        outcome.error = f"{got} of {tokens} tokens"
                    return outcome
                chunk = json.loads(data)
                if "error" in chunk:
                    outcome.error = str(chunk["error"].get("code") or chunk["error"])
                    return outcome
                if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                    got += 1
            outcome.error = "stream ended without [DONE]"
    except (aiohttp.ClientError, TimeoutError) as exc:
        outcome.error = type(exc).__name__
    return outcome


async def drive(cluster: Cluster, gateway: str, trace: list[Request]) -> list[Pair]:
    """Send each request of the trace at its (scaled) time, to the pooled and baseline copies."""
    url = gateway + "/v1/chat/completions"
    pairs: list[Pair] = []
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=timeout
    ) as session:

        async def one(pair: Pair) -> None:
            i, tokens = pair.request.model, pair.request.tokens
            pair.pooled, pair.baseline = await asyncio.gather(
                ask(session, url, f"m{i}", tokens), ask(session, url, f"base{i}", tokens)
            )

        tasks = []
        start = time.monotonic()
        shown = start
        for request in trace:
            delay = start + cluster.time.wall(request.at) - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            pair = Pair(request, cluster.state_of(f"m{request.model}"), time.time())
            pairs.append(pair)
            tasks.append(asyncio.create_task(one(pair)))
            if time.monotonic() - shown > 30:
                shown = time.monotonic()
                progress(f"{len(pairs)} of {len(trace)} requests sent")
        await asyncio.gather(*tasks)
    return pairs


def summarize(
    args: argparse.Namespace,
    pairs: list[Pair],
    counts: dict[str, dict[str, int]],
    metrics: dict[str, dict[str, float]],
) -> dict[str, Any]:
    k = args.time_scale
    hours = args.minutes / 60
    before, after = metrics["before"], metrics["after"]

    def moved(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    requests = [p.request for p in pairs]
    crowded = oversubscribed(requests, pools=args.pools, fits=pool_fits(args))
    forced = forced_over_limit(requests, args)
    both = [p for p in pairs if p.pooled.ok and p.baseline.ok]
    added = [p.added for p in both]
    by_state: dict[str, Any] = {}
    for state in ("awake", "asleep-room", "asleep-full", "sleeping", "waking"):
        mine = [p for p in both if p.state == state]
        if mine:
            by_state[state] = {"requests": len(mine), **percentiles([p.added for p in mine], k)}
    failures: dict[str, int] = {}
    for p in pairs:
        for side, outcome in (("pooled", p.pooled), ("baseline", p.baseline)):
            if not outcome.ok:
                key = f"{side}: {outcome.error}"
                failures[key] = failures.get(key, 0) + 1
    wake = WAKE_SECONDS + KV_WAKE_SECONDS
    start, end = counts["before"], counts["after"]
    during = {key: end[key] - start[key] for key in end}
    p99 = percentiles(added, k)["p99"]
    failed = sum(1 for p in pairs if not p.pooled.ok)
    ooms = during["wake_ooms"] + during["start_refusals"] + moved("snooze_pool_oom_total")
    wakes = moved("snooze_wake_duration_seconds_count")
    sleeps = moved("snooze_sleep_duration_seconds_count")
    return {
        "benchmark": "pools",
        "command": "python pools.py " + shlex.join(sys.argv[1:]),
        "machine": {
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "load_average_1m_at_end": round(os.getloadavg()[0], 2),
        },
        "scenario": {
            "models": args.models,
            "pools": args.pools,
            "pool_gib": args.pool_gib,
            "footprints_gib": footprints(args.models),
            "trace_minutes": args.minutes,
            "time_scale": k,
            "seed": args.seed,
            "idle_after": args.idle_after,
            "min_residency": args.min_residency,
            "eviction": args.eviction,
            "headroom_idle_after": args.headroom or None,
            "prime_idle_after": args.prime or None,
            "engine_sleep_seconds": SLEEP_SECONDS,
            "engine_pinning_share": args.pinning_share,
            "engine_wake_seconds": wake,
            "operator_reads_gateway_counters": True,
        },
        "gpus": {"pools": args.pools, "one_per_model": args.models},
        "models_per_gpu": round(args.models / args.pools, 2),
        "requests": {
            "sent": len(pairs),
            "answered": sum(1 for p in pairs if p.pooled.ok),
            "failed": failed,
            "baseline_answered": sum(1 for p in pairs if p.baseline.ok),
            "failures": failures,
        },
        "first_token_seconds": {
            "pooled": percentiles([p.pooled.first_token or 0.0 for p in both], k),
            "baseline": percentiles([p.baseline.first_token or 0.0 for p in both], k),
        },
        "added_seconds": percentiles(added, k),
        "over_limit": {
            "requests": sum(1 for a in added if a * k > LIMIT),
            "share": round(sum(1 for a in added if a * k > LIMIT) / max(len(added), 1), 4),
        },
        "added_seconds_by_state_at_send": by_state,
        "oversubscribed": {
            "requests": crowded,
            "share": round(crowded / max(len(pairs), 1), 4),
            "meaning": "sent while more models of their pool had a request in the minute up to "
            "them than fit awake together (a measure of the trace: in those minutes some "
            "requests wait for a swap, whatever the policy)",
        },
        "forced_over_limit": {
            "requests": forced,
            "share": round(forced / max(len(pairs), 1), 4),
            "meaning": "a lower bound from the trace alone: sent while the models of their pool "
            "with a request in flight left no room, so that waiting for the first of those to "
            "end, then for its sleep (the fastest a member sleeps) and a wake, already exceeds "
            "the bound (no policy puts a busy engine to sleep); above 1% of the requests, no "
            "policy meets the p99 target on this trace",
        },
        "per_hour": {
            "swaps": round(during["swaps"] / hours, 1),
            "idle_sleeps": round(during["idle_sleeps"] / hours, 1),
            "wakes": round(during["wakes"] / hours, 1),
        },
        "failed_sleeps_or_wakes": during["failed_sleeps_or_wakes"],
        "evictions_metric": {
            "trace": {r: moved(f"evictions_{r}") for r in EVICTION_REASONS},
            "startup": {r: before.get(f"evictions_{r}", 0.0) for r in EVICTION_REASONS},
        },
        "swaps_startup": start["swaps"],
        "wake_ooms": {"trace": during["wake_ooms"], "startup": start["wake_ooms"]},
        "start_refusals": {"trace": during["start_refusals"], "startup": start["start_refusals"]},
        "pool_oom_metric": moved("snooze_pool_oom_total"),
        "pool_wait_mean_seconds": round(
            k
            * moved("snooze_pool_wait_seconds_sum")
            / max(moved("snooze_pool_wait_seconds_count"), 1),
            3,
        ),
        "wake_seconds_measured_mean": round(
            k * moved("snooze_wake_duration_seconds_sum") / max(wakes, 1), 3
        ),
        "sleep_seconds_measured_mean": round(
            k * moved("snooze_sleep_duration_seconds_sum") / max(sleeps, 1), 3
        ),
        "target": {
            "models_per_gpu_at_least_4": args.models / args.pools >= 4,
            "zero_failed": failed == 0,
            "zero_ooms": ooms == 0,
            "p99_added_seconds_limit": LIMIT,
            "p99_added_within_limit": p99 is not None and p99 <= LIMIT,
            "met": args.models / args.pools >= 4
            and failed == 0
            and ooms == 0
            and p99 is not None
            and p99 <= LIMIT,
        },
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    logs = Path(args.logs)
    logs.mkdir(parents=True, exist_ok=True)
    trace = trace_for(args, args.seed)
    progress(f"trace: {len(trace)} requests over {args.minutes} min (seed {args.seed})")
    with bench() as setup, SimulatorHost() as sim:
        if args.operator_pythonpath:
            setup.env["PYTHONPATH"] = args.operator_pythonpath
        cluster = Cluster(setup, sim, args)
        cluster.create()
        # The operator reads the gateway's per-engine counters, as the chart sets it up
        # (--gateway-service there): it then knows from them which engines serve requests.
        gateway_metrics = free_port()
        gateway = setup.gateway(metrics_port=gateway_metrics)
        metrics_port = free_port()
        interval = str(cluster.time.wall(PROBE_INTERVAL))
        command = [sys.executable, "-m", "snooze.cli", "operator", "--probe-interval", interval]
        command += ["--drift-interval", str(cluster.time.wall(DRIFT_INTERVAL))]
        command += ["--gateway-metrics", f"http://127.0.0.1:{gateway_metrics}/metrics"]
        command += ["--metrics-port", str(metrics_port)]
        with (logs / "operator.log").open("wb") as out:
            setup.procs.append(
                subprocess.Popen(command, env=setup.env, stdout=out, stderr=subprocess.STDOUT)
            )
        metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        wait_until("the operator's metrics", lambda: httpx.get(metrics_url).is_success, 60)
        progress("starting the pools' members")
        cluster.start_members()
        wait_until("every engine settled", cluster.settled, 120)
        counts = {"before": cluster.counters()}
        metrics = {"before": scrape(metrics_url)}
        progress(f"settled: {cluster.labels()}; trace starts")
        pairs = asyncio.run(drive(cluster, gateway, trace))
        counts["after"] = cluster.counters()
        metrics["after"] = scrape(metrics_url)
        dump(logs, cluster, pairs)
    return summarize(args, pairs, counts, metrics)


def dump(logs: Path, cluster: Cluster, pairs: list[Pair]) -> None:
    """Each request and each Event of the pools and their members, one JSON per line, to read
    a slow request against what the pool did at the time."""
    k = cluster.time.factor
    with (logs / "requests.jsonl").open("w") as out:
        for p in pairs:
            row = {
                "sent": round(p.sent, 3),
                "at": round(p.request.at, 3),
                "model": f"m{p.request.model}",
                "tokens": p.request.tokens,
                "state": p.state,
                "first_token": p.pooled.first_token and round(k * p.pooled.first_token, 3),
                "baseline": p.baseline.first_token and round(k * p.baseline.first_token, 3),
                "error": p.pooled.error,
            }
            out.write(json.dumps(row) + "\n")
    names = set(cluster.pool_of) | set(cluster.pool_of.values())
    events = cluster.api.get(f"/api/v1/namespaces/{NS}/events").json()["items"]
    rows = [
        {
            "time": e.get("lastTimestamp") or e.get("eventTime"),
            "object": e["involvedObject"]["name"],
            "reason": e.get("reason"),
            "message": e.get("message"),
        }
        for e in events
        if e["involvedObject"]["name"] in names
    ]
    with (logs / "events.jsonl").open("w") as out:
        for row in sorted(rows, key=lambda r: str(r["time"])):
            out.write(json.dumps(row) + "\n")


def check(args: argparse.Namespace) -> str | None:
    """What is wrong with the arguments, said so that it can be fixed; None if nothing."""
    if args.pools < 1 or args.models < args.pools:
        return f"--models ({args.models}) must be at least --pools ({args.pools}), itself >= 1"
    if args.models > 240:
        return "--models must be at most 240 (one loopback address per engine)"
    if not (args.time_scale > 0 and args.minutes > 0):
        return "--time-scale and --minutes must be greater than zero"
    if not 0 <= args.pinning_share < 1:
        return f"--pinning-share must be at least 0 and below 1, not {args.pinning_share}"
    flags = [("--idle-after", args.idle_after), ("--min-residency", args.min_residency)]
    flags += [
        (flag, value)
        for flag, value in (("--headroom", args.headroom), ("--prime", args.prime))
        if value
    ]
    for flag, value in flags:
        if value == "Never" and flag == "--idle-after":
            continue
        try:
            if parse_duration(value) <= 0:
                raise DurationError(f"{value!r} is not longer than zero")
        except DurationError as exc:
            return f"{flag}: {exc}"
    members = -(-args.models // args.pools)
    sizes = footprints(args.models)
    if max(sizes) + (members - 1) * ASLEEP_GIB > args.pool_gib:
        return (
            f"--pool-gib {args.pool_gib} is too small: an engine takes up to {max(sizes)} GiB "
            f"awake and each of the {members - 1} other members of its pool {ASLEEP_GIB} GiB "
            f"asleep; give at least {max(sizes) + (members - 1) * ASLEEP_GIB}"
        )
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=8)
    parser.add_argument("--pools", type=int, default=2)
    parser.add_argument("--pool-gib", type=int, default=80)
    parser.add_argument("--minutes", type=float, default=30.0, help="trace length (trace time)")
    parser.add_argument("--time-scale", type=float, default=10.0, help="trace seconds per wall s")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--idle-after", default="10m", help="the models' idle.after, or Never")
    parser.add_argument("--min-residency", default="30s", help="the pools' minResidency")
    parser.add_argument(
        "--eviction", default="LeastRecentlyUsed", choices=("LeastRecentlyUsed", "Cheapest")
    )
    parser.add_argument(
        "--headroom",
        default="",
        help="give each pool a headroom of one wake, slept for by members idle this long "
        "(trace time, such as 20s); default: none (room is made when a wake asks)",
    )
    parser.add_argument(
        "--prime",
        default="",
        help="have each pool prime its members idle this long (trace time, such as 10s): "
        "their first, pinning level-1 sleep done ahead of need; default: off",
    )
    parser.add_argument(
        "--pinning-share",
        type=float,
        default=EngineConfig().pinning_share,
        help="the part of an engine's first level-1 sleep spent pinning host RAM, which its "
        "later ones skip (default: the simulator's, %(default)s; 0: every sleep pins, as the "
        "simulator had it before)",
    )
    parser.add_argument("--zipf", type=float, default=1.0, help="popularity exponent")
    parser.add_argument("--bursts-per-hour", type=float, default=60.0)
    parser.add_argument("--burst-seconds", type=float, default=120.0, help="mean on period")
    parser.add_argument("--request-gap", type=float, default=5.0, help="mean gap in a burst")
    parser.add_argument(
        "--operator-pythonpath",
        default="",
        help="run the operator from this source tree instead (to measure a proposed fix)",
    )
    parser.add_argument(
        "--logs", default="/tmp/snooze-pools", help="the operator's log, each request, the Events"
    )
    args = parser.parse_args()
    problem = check(args)
    if problem:
        parser.error(problem)
    with contextlib.suppress(KeyboardInterrupt):
        print(json.dumps(run(args)))


if __name__ == "__main__":
    main()
