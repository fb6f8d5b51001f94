"""A seeded request trace for many models: skewed popularity (Zipf) and bursts (on/off periods)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Request:
    at: float
    """Seconds from the start of the trace."""
    model: int
    """The model's popularity rank: 0 is the most requested."""
    tokens: int
    """max_tokens of the request (the engine generates exactly this many)."""


@dataclass(frozen=True, kw_only=True)
class TraceShape:
    models: int
    seconds: float
    zipf: float = 1.0
    """Exponent of the popularity: model i gets bursts in proportion to 1 / (i + 1) ** zipf."""
    bursts_per_hour: float = 60.0
    """Bursts of all models together, on average."""
    burst_seconds: float = 120.0
    """Mean length of an on period (exponential)."""
    request_gap: float = 5.0
    """Mean time between two requests inside a burst (exponential: Poisson arrivals)."""
    mean_tokens: int = 128


def generate(shape: TraceShape, seed: int) -> list[Request]:
    """Each model alternates off and on periods and is requested only while on. Off periods
    are exponential with a mean of one over the model's share of `bursts_per_hour` (so the
    popular ones are off briefly, and with on periods between them a model starts somewhat
    fewer bursts than its share); a burst's first request comes at its start."""
    rng = random.Random(seed)
    weights = [1.0 / (i + 1) ** shape.zipf for i in range(shape.models)]
    total = sum(weights)
    requests: list[Request] = []
    for model, weight in enumerate(weights):
        bursts_per_second = shape.bursts_per_hour / 3600 * weight / total
        at = rng.expovariate(bursts_per_second)
        while at < shape.seconds:
            end = min(at + rng.expovariate(1 / shape.burst_seconds), shape.seconds)
            sent = at
            while sent < end:
                tokens = rng.randint(16, 2 * shape.mean_tokens - 16)
                requests.append(Request(at=sent, model=model, tokens=tokens))
                sent += rng.expovariate(1 / shape.request_gap)
            at = end + rng.expovariate(bursts_per_second)
    requests.sort(key=lambda r: (r.at, r.model))
    return requests


def oversubscribed(
    requests: list[Request],
    *,
    pools: int,
    fits: Callable[[frozenset[int]], bool],
    window: float = 60.0,
) -> int:
    """The requests that come while their pool is wanted by more models than fit awake on it
    together (`fits`: whether a set of models fits awake, the others asleep): the models of
    the request's pool with a request in the `window` seconds up to it, its own included. A
    measure of the trace, not of the pool's policy: in those minutes the pool cannot keep
    every model asked for awake, so some of their requests wait for a swap whatever it does."""
    count = 0
    recent: list[dict[int, float]] = [{} for _ in range(pools)]  # model -> its last request
    for request in requests:
        last = recent[request.model % pools]
        last[request.model] = request.at
        active = frozenset(m for m, at in last.items() if request.at - at <= window)
        if not fits(active):
            count += 1
    return count


def forced_waits(
    requests: list[Request],
    *,
    pools: int,
    fits: Callable[[frozenset[int]], bool],
    token_seconds: float,
    wake_seconds: float,
    bound: float,
    sleep_seconds: float = 0.0,
) -> int:
    """The requests that wait longer than `bound` whatever the pool's policy, by the trace
    alone: a request whose model has none of its own in flight, while the models of its pool
    that do (each request in flight from its `at` for `tokens * token_seconds`, as on an
    always-on engine) leave it no room, must wait until one of those ends (no policy puts a
    busy engine to sleep), then for that engine's sleep (its memory is free only once the sleep
    is confirmed; `sleep_seconds`: the fastest any member sleeps), then for its own wake.
    Counted when that wait exceeds `bound`: a lower bound on the requests over the bound. The
    pooled run delays some requests, which only adds."""
    count = 0
    ends: list[dict[int, float]] = [{} for _ in range(pools)]  # model -> end of its last request
    for request in requests:
        pool = ends[request.model % pools]
        busy = {m: end for m, end in pool.items() if end > request.at and m != request.model}
        own_in_flight = pool.get(request.model, 0.0) > request.at
        if not own_in_flight and busy and not fits(frozenset(busy) | {request.model}):
            wait = min(busy.values()) - request.at + sleep_seconds + wake_seconds
            if wait > bound:
                count += 1
        end = request.at + request.tokens * token_seconds
        pool[request.model] = max(pool.get(request.model, 0.0), end)
    return count
