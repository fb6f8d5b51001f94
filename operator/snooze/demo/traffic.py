"""The traffic generator: OpenAI chat completions through the gateway, timed and recorded."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from dataclasses import dataclass

import httpx

from snooze.demo.scenario import TOKENS, Planned

HELD_HEADER = "x-snooze-held-seconds"
HELD_COMMENT = re.compile(rb"^: held ([0-9.]+)s")


@dataclass(kw_only=True)
class Record:
    """One request as the client saw it; times are seconds since the scenario started."""

    model: str
    stream: bool
    planned: float
    sent: float = 0.0
    first_byte: float | None = None
    answered: float | None = None
    status: int | None = None
    held: float = 0.0
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200 and not self.error and self.answered is not None


async def send(client: httpx.AsyncClient, record: Record, *, t0: float) -> None:
    """Send one chat completion and fill in `record`; never raises (errors are recorded)."""
    body = {
        "model": record.model,
        "messages": [{"role": "user", "content": f"hello {record.model}"}],
        "max_tokens": TOKENS,
        "stream": record.stream,
    }
    record.sent = time.monotonic() - t0
    try:
        if record.stream:
            await _stream(client, body, record, t0)
        else:
            response = await client.post("/v1/chat/completions", json=body)
            record.first_byte = record.answered = time.monotonic() - t0
            record.status = response.status_code
            record.held = float(response.headers.get(HELD_HEADER, "0") or 0)
            if response.status_code != 200:
                record.error = _message(response.content)
            elif not response.json()["choices"][0]["message"]["content"]:
                record.error = "empty answer"
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        record.error = f"{type(exc).__name__}: {exc}"
        record.answered = time.monotonic() - t0


async def _stream(
    client: httpx.AsyncClient, body: dict[str, object], record: Record, t0: float
) -> None:
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        record.status = response.status_code
        held = response.headers.get(HELD_HEADER)
        if held:
            record.held = float(held)
        if response.status_code != 200:
            record.error = _message(await response.aread())
            record.answered = time.monotonic() - t0
            return
        tokens = 0
        done = False
        # Read to the end of the body, past [DONE]: a client that hangs up before the last
        # chunk makes the gateway fail to finish a response it sent in full.
        async for line in response.aiter_lines():
            raw = line.encode()
            match = HELD_COMMENT.match(raw)
            if match:
                # A held stream began before any pod was awake: the wait is in a comment.
                record.held = float(match.group(1))
            if done or not raw.startswith(b"data: "):
                continue
            if record.first_byte is None:
                record.first_byte = time.monotonic() - t0
            payload = raw[len(b"data: ") :]
            if payload == b"[DONE]":
                done = True
                record.answered = time.monotonic() - t0
                continue
            event = json.loads(payload)
            if "error" in event:
                record.error = str(event["error"].get("message", event["error"]))
                done = True
                continue
            tokens += 1
        if record.answered is None:
            record.answered = time.monotonic() - t0
        if not record.error and tokens == 0:
            record.error = "empty stream"


def _message(content: bytes) -> str:
    try:
        return str(json.loads(content)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return content[:200].decode(errors="replace")


async def run_traffic(
    *, url: str, plan: list[Planned], t0: float, stop: asyncio.Event, records: list[Record]
) -> None:
    """Send each planned request at its time until `stop`; then wait for those in flight."""
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=50)
    # Held requests may wait for a cold start: the read timeout is the scenario's, not httpx's.
    timeout = httpx.Timeout(connect=5.0, read=300.0, write=10.0, pool=30.0)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout) as client:
        tasks: list[asyncio.Task[None]] = []
        for planned in plan:
            delay = t0 + planned.at - time.monotonic()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
            if stop.is_set():
                break
            record = Record(model=planned.model, stream=planned.stream, planned=planned.at)
            records.append(record)
            tasks.append(asyncio.create_task(send(client, record, t0=t0)))
        if tasks:
            await asyncio.gather(*tasks)
