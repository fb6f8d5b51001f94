"""Simulated engines for the fleet benchmark, in a process of their own, stamping every probe.

Like `snooze sim --count N`, plus a control port: `GET /probes` returns, per engine address,
the times (epoch seconds) of the `/metrics` requests (one per probe) it received since
`POST /reset`, so the benchmark sees from the engines' side how often each one is probed.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from snooze.sim.engine import EngineConfig, SimulatedEngine
from snooze.sim.host import raise_fd_limit
from snooze.sim.server import build_app

BATCH = 200
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def stamping(stamps: list[float]) -> Middleware:
    """A middleware that notes the time of every `/metrics` request."""

    @web.middleware
    async def stamp(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.rstrip("/") == "/metrics":  # the probes ask /metrics/
            stamps.append(time.time())
        return await handler(request)

    return stamp


async def serve(
    first: str,
    count: int,
    per_model: int,
    control_port: int,
    sleep_seconds: float,
    first_index: int = 0,
) -> None:
    probes: dict[str, list[float]] = {}
    runners: list[web.AppRunner] = []

    async def start(index: int, host: str) -> None:
        # Engine i serves model m{i // per_model:04d}, the InferenceModel that selects its pod.
        model = f"m{(first_index + index) // per_model:04d}"
        # No weights checksum at each first sleep: the fleet measures the operator's own
        # costs; benchmarks/verify.py measures the checks'.
        config = EngineConfig(
            model=model,
            host=host,
            port=8000,
            token_seconds=0.0,
            sleep_seconds=sleep_seconds,
            checksum_seconds_per_gib=0.0,
        )
        engine = SimulatedEngine(config)
        # Each engine has a device of its own: it always has room to load, as vLLM would.
        if not engine.try_to_load():
            raise SystemExit(f"engine {host} could not load: {engine.start_refusal}")
        await engine.load_model()
        app = build_app(engine)
        app.middlewares.append(stamping(probes.setdefault(host, [])))
        runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=0.1)
        await runner.setup()
        await web.TCPSite(runner, host, 8000, reuse_address=True).start()
        runners.append(runner)

    hosts = [str(ipaddress.ip_address(first) + i) for i in range(count)]
    for begin in range(0, count, BATCH):
        batch = range(begin, min(begin + BATCH, count))
        await asyncio.gather(*(start(i, hosts[i]) for i in batch))

    async def get_probes(_: web.Request) -> web.Response:
        return web.json_response(probes)

    async def reset(_: web.Request) -> web.Response:
        for stamps in probes.values():
            stamps.clear()
        return web.json_response({"engines": len(probes)})

    control = web.Application()
    control.router.add_get("/probes", get_probes)
    control.router.add_post("/reset", reset)
    runner = web.AppRunner(control, handle_signals=False, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", control_port).start()
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.1.0.1", help="first engine address")
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--per-model", type=int, default=2, help="engines of each model")
    parser.add_argument("--control-port", type=int, required=True)
    parser.add_argument("--sleep-seconds", type=float, default=0.1)
    parser.add_argument(
        "--first-index", type=int, default=0, help="the fleet-wide index of the first engine"
    )
    args = parser.parse_args()
    raise_fd_limit()
    asyncio.run(
        serve(
            args.host,
            args.count,
            args.per_model,
            args.control_port,
            args.sleep_seconds,
            args.first_index,
        )
    )


if __name__ == "__main__":
    main()
