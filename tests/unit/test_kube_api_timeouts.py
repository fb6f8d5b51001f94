"""The Kubernetes client's timeouts bound silence, not size: a long answer that keeps coming
(a list of ten thousand pods) is read whole, a server that says nothing is given up on and
retried, and calls queued behind others are not timed out by the queue."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml
from aiohttp import web

from snooze.kube import api as kube_api
from snooze.kube.api import KubeApi, KubeError, pods_ref
from snooze.kube.credentials import Source

TIMEOUT = 0.5


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, dict[str, int]]]:
    """`/slow`: a pod list sent in pieces, 0.3 s apart, 1.2 s in all; `/silent`: no answer for
    2 s; `/quick`: a list after 0.2 s. Counts the calls to each."""
    calls = {"slow": 0, "silent": 0, "quick": 0}

    async def slow(request: web.Request) -> web.StreamResponse:
        calls["slow"] += 1
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        body = json.dumps({"items": [{"metadata": {"name": f"pod-{i}"}} for i in range(4000)]})
        piece = len(body) // 4 + 1
        for start in range(0, len(body), piece):
            await asyncio.sleep(0.3)
            await response.write(body[start : start + piece].encode())
        await response.write_eof()
        return response

    async def silent(request: web.Request) -> web.Response:
        calls["silent"] += 1
        await asyncio.sleep(2)
        return web.json_response({"items": []})

    async def quick(request: web.Request) -> web.Response:
        calls["quick"] += 1
        await asyncio.sleep(0.2)
        return web.json_response({"items": []})

    app = web.Application()
    app.router.add_get("/api/v1/namespaces/slow/pods", slow)
    app.router.add_get("/api/v1/namespaces/silent/pods", silent)
    app.router.add_get("/api/v1/namespaces/quick/pods", quick)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", calls
    finally:
        await runner.cleanup()


def api_for(tmp: Path, url: str, **options: int | float) -> KubeApi:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": url}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    (tmp / "kubeconfig").write_text(yaml.safe_dump(config))
    return KubeApi(Source(kubeconfig=(str(tmp / "kubeconfig"),)), **options)  # type: ignore[arg-type]


async def test_a_long_answer_that_keeps_coming_is_read_whole(
    server: tuple[str, dict[str, int]], tmp_path: Path
) -> None:
    url, calls = server
    api = api_for(tmp_path, url, timeout=TIMEOUT)
    try:
        listing = await api.list(pods_ref("slow"))
    finally:
        await api.aclose()
    assert len(listing["items"]) == 4000
    assert calls["slow"] == 1  # not timed out and retried


async def test_a_silent_server_is_given_up_on_and_retried(
    server: tuple[str, dict[str, int]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kube_api, "BACKOFF", (0.0,))
    url, calls = server
    api = api_for(tmp_path, url, timeout=TIMEOUT)
    try:
        with pytest.raises(KubeError, match=r"kept failing: .*Timeout"):
            await api.list(pods_ref("silent"))
    finally:
        await api.aclose()
    assert calls["silent"] == 2  # the call and its one retry


async def test_calls_waiting_for_a_slot_are_not_timed_out_by_the_wait(
    server: tuple[str, dict[str, int]], tmp_path: Path
) -> None:
    """Eight calls of 0.2 s through one slot: the last waits 1.4 s, beyond the timeout."""
    url, calls = server
    api = api_for(tmp_path, url, timeout=TIMEOUT, slots=1)
    try:
        answers = await asyncio.gather(*(api.list(pods_ref("quick")) for _ in range(8)))
    finally:
        await api.aclose()
    assert answers == [{"items": []}] * 8
    assert calls["quick"] == 8  # none retried
