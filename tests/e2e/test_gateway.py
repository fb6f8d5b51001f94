"""The gateway end to end: sandbox API, simulated engines, the real operator, the openai client."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest
from gateway_fixtures import GatewayThread, gateway, start_gateway
from waits import wait_for

from snooze.sim import EngineConfig, SimulatedEngine

from .conftest import Cluster, OperatorThread, _addresses

__all__ = ["gateway"]  # the fixture, imported to be found by pytest
MESSAGES: list[Any] = [{"role": "user", "content": "hello"}]


def engine_config(model: str, **options: Any) -> EngineConfig:
    settings: dict[str, Any] = {
        "sleep_seconds": 0.05,
        "wake_seconds": 0.3,
        "reload_seconds": 0.05,
        "token_seconds": 0.002,
        "checksum_seconds_per_gib": 0.001,
        **options,
    }
    return EngineConfig(model=model, host=next(_addresses), port=8000, **settings)


def add_model(
    cluster: Cluster, name: str, *, pods: int = 1, spec: dict[str, Any] | None = None, **engine: Any
) -> list[SimulatedEngine]:
    labels = {"app": name}
    engines = [
        cluster.create_pod(f"{name}-{i}", labels=labels, engine=engine_config(name, **engine))
        for i in range(pods)
    ]
    body = {"selector": {"matchLabels": labels}, "idle": {"after": "1s"}, **(spec or {})}
    cluster.create_model(name, body)
    return engines


def client(gw: GatewayThread, **options: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0, **options)


def gateway_view(gw: GatewayThread, name: str) -> dict[str, Any]:
    listing = httpx.get(gw.url + "/v1/models").json()
    return next((m["snooze"] for m in listing["data"] if m["id"] == name), {})


def wait_asleep(cluster: Cluster, gw: GatewayThread, name: str, pods: int = 1) -> None:
    names = [f"{name}-{i}" for i in range(pods)]
    wait_for("pods asleep", lambda: all(cluster.pod_state(n) == "asleep" for n in names))
    wait_for(
        "the gateway to see no awake pod",
        lambda: (v := gateway_view(gw, name)) and v["awake"] == 0 and v["pods"] == pods,
    )


def test_lists_every_model_sleeping_ones_too(
    cluster: Cluster, operator: OperatorThread, gateway: GatewayThread
) -> None:
    add_model(cluster, "sleepy")
    add_model(cluster, "busy", spec={"idle": {"after": "1h"}})
    wait_asleep(cluster, gateway, "sleepy")
    wait_for("busy awake", lambda: gateway_view(gateway, "busy").get("awake") == 1)
    assert httpx.get(gateway.url + "/readyz").status_code == 200
    assert httpx.get(gateway.url + "/healthz").status_code == 200

    assert client(gateway).models.retrieve("busy").id == "busy"
    listed = {m.id: m for m in client(gateway).models.list()}
    assert set(listed) == {"sleepy", "busy"}
    sleepy = listed["sleepy"].model_extra or {}
    assert sleepy["snooze"]["awake"] == 0
    assert sleepy["snooze"]["namespace"] == "default"
    wait_for("phase Asleep", lambda: gateway_view(gateway, "sleepy")["phase"] == "Asleep")


def test_sleeping_model_wakes_for_a_request_streaming_or_not(
    cluster: Cluster, operator: OperatorThread, gateway: GatewayThread
) -> None:
    (engine,) = add_model(cluster, "chat")
    wait_asleep(cluster, gateway, "chat")

    raw = client(gateway).chat.completions.with_raw_response.create(
        model="chat", messages=MESSAGES, max_tokens=4
    )
    completion = raw.parse()
    assert completion.choices[0].message.content
    assert float(raw.headers["x-snooze-held-seconds"]) >= 0.3  # the engine's wake time
    assert engine.wake_calls == 1

    wait_asleep(cluster, gateway, "chat")
    with httpx.stream(
        "POST",
        gateway.url + "/v1/chat/completions",
        json={"model": "chat", "messages": MESSAGES, "max_tokens": 4, "stream": True},
        timeout=30,
    ) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line]
    assert lines[0] == ": waiting for model chat to wake", lines
    assert any(line.startswith(": held ") for line in lines)
    assert lines[-1] == "data: [DONE]"

    wait_asleep(cluster, gateway, "chat")
    stream = client(gateway).chat.completions.create(
        model="chat", messages=MESSAGES, max_tokens=4, stream=True
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text.split() == ["lorem", "ipsum", "dolor", "sit"]
    assert engine.wake_calls == 3
    assert gateway.call(lambda: len(gateway.g.held_seconds)) == 3


def test_fifty_concurrent_requests_cause_one_wake(
    cluster: Cluster, operator: OperatorThread, gateway: GatewayThread
) -> None:
    (engine,) = add_model(cluster, "crowd", max_concurrency=64)
    wait_asleep(cluster, gateway, "crowd")
    api = client(gateway)

    def ask(_: int) -> str:
        reply = api.chat.completions.create(model="crowd", messages=MESSAGES, max_tokens=2)
        return reply.choices[0].message.content or ""

    with ThreadPoolExecutor(50) as pool:
        answers = list(pool.map(ask, range(50)))
    assert answers == ["lorem ipsum"] * 50
    assert engine.wake_calls == 1
    assert wake_requests(gateway) == 1
    # The metric counts annotations written, not requests that waited on one.
    sample = {"namespace": "default", "model": "crowd"}
    metric = gateway.metrics.registry.get_sample_value("snooze_gateway_wake_requests_total", sample)
    assert metric == 1
    assert cluster.model("crowd")["metadata"]["annotations"]["snooze.dev/wake-requested-at"]


def test_two_replicas_share_one_wake(
    cluster: Cluster, operator: OperatorThread, gateway: GatewayThread
) -> None:
    other = start_gateway()
    try:
        (engine,) = add_model(cluster, "shared", max_concurrency=64)
        wait_asleep(cluster, gateway, "shared")
        wait_for("the other replica to see it asleep", lambda: gateway_view(other, "shared"))
        apis = [client(gateway), client(other)]

        def ask(n: int) -> str:
            reply = apis[n % 2].chat.completions.create(
                model="shared", messages=MESSAGES, max_tokens=2
            )
            return reply.choices[0].message.content or ""

        with ThreadPoolExecutor(40) as pool:
            assert list(pool.map(ask, range(40))) == ["lorem ipsum"] * 40
        assert engine.wake_calls == 1
        asked = [wake_requests(gateway), wake_requests(other)]
        # Each replica re-reads the model before annotating; only a race within one round
        # trip to the API lets both write (the operator still wakes once).
        assert 1 <= sum(asked) <= 2, asked
    finally:
        other.stop()


def test_wake_slower_than_its_timeout_gives_504(
    cluster: Cluster, operator: OperatorThread, gateway: GatewayThread
) -> None:
    add_model(cluster, "slow", spec={"wake": {"timeout": "1s"}}, wake_seconds=3.0)
    wait_asleep(cluster, gateway, "slow")
    began = time.monotonic()
    with pytest.raises(openai.APIStatusError) as caught:
        client(gateway).chat.completions.create(model="slow", messages=MESSAGES, max_tokens=2)
    assert caught.value.status_code == 504
    assert "did not wake within" in caught.value.message
    assert 0.9 <= time.monotonic() - began < 2.5

    # Streaming: the 200 and the waiting comments have gone out; the end is an error event.
    stream = client(gateway).chat.completions.create(
        model="slow", messages=MESSAGES, max_tokens=2, stream=True
    )
    with pytest.raises(openai.APIError, match="did not wake within"):
        list(stream)


def test_held_request_limit_gives_429_with_retry_after(
    cluster: Cluster, operator: OperatorThread
) -> None:
    gw = start_gateway(max_held_per_model=2)
    try:
        add_model(cluster, "small", wake_seconds=1.0)
        wait_asleep(cluster, gw, "small")
        api = client(gw)
        with ThreadPoolExecutor(2) as pool:
            held = [
                pool.submit(
                    api.chat.completions.create, model="small", messages=MESSAGES, max_tokens=2
                )
                for _ in range(2)
            ]
            wait_for("two held", lambda: gw.call(lambda: sum(gw.g.holds.held.values())) == 2)
            refused = httpx.post(
                gw.url + "/v1/chat/completions", json={"model": "small", "messages": MESSAGES}
            )
            assert refused.status_code == 429
            assert int(refused.headers["Retry-After"]) >= 1
            assert refused.json()["error"]["code"] == "wake_queue_full"
            assert all(f.result(15).choices[0].message.content for f in held)
    finally:
        gw.stop()


def test_client_leaving_while_held_does_not_harm_the_others(
    cluster: Cluster, operator: OperatorThread, gateway: GatewayThread
) -> None:
    add_model(cluster, "patient", wake_seconds=1.5)
    wait_asleep(cluster, gateway, "patient")
    api = client(gateway)
    with ThreadPoolExecutor(4) as pool:
        stayers = [
            pool.submit(
                api.chat.completions.create, model="patient", messages=MESSAGES, max_tokens=2
            )
            for _ in range(3)
        ]
        wait_for("three held", lambda: held(gateway) == 3)
        leaver = pool.submit(
            httpx.post,
            gateway.url + "/v1/chat/completions",
            json={"model": "patient", "messages": MESSAGES},
            timeout=httpx.Timeout(5, read=0.5),
        )
        wait_for("four held", lambda: held(gateway) == 4)
        with pytest.raises(httpx.ReadTimeout):
            leaver.result(5)
        wait_for("the leaver gone from the queue", lambda: held(gateway) == 3, timeout=1.0)
        assert [f.result(15).choices[0].message.content for f in stayers] == ["lorem ipsum"] * 3
    assert held(gateway) == 0


def wake_requests(gw: GatewayThread) -> int:
    return gw.call(lambda: gw.g.wakes.written)


def held(gw: GatewayThread) -> int:
    return gw.call(lambda: sum(gw.g.holds.held.values()))


def test_models_that_must_not_wake_are_refused_at_once(
    cluster: Cluster, operator: OperatorThread, gateway: GatewayThread
) -> None:
    add_model(cluster, "off", spec={"desiredState": "Asleep"})
    add_model(cluster, "manual", spec={"wake": {"onRequest": False}})
    wait_asleep(cluster, gateway, "off")
    wait_asleep(cluster, gateway, "manual")
    for name, hint in (("off", "desiredState"), ("manual", "onRequest")):
        began = time.monotonic()
        answer = httpx.post(gateway.url + "/v1/completions", json={"model": name, "prompt": "x"})
        assert answer.status_code == 503
        assert hint in answer.json()["error"]["message"]
        assert time.monotonic() - began < 0.5
    assert wake_requests(gateway) == 0


def test_bad_requests_get_openai_shaped_errors(gateway: GatewayThread) -> None:
    wait_for("ready", lambda: httpx.get(gateway.url + "/readyz").status_code == 200)
    url = gateway.url + "/v1/chat/completions"
    cases = [
        (httpx.post(url, json={"model": "nope", "messages": MESSAGES}), 404),
        (httpx.post(url, content=b"{not json"), 400),
        (httpx.post(url, json=["a list"]), 400),
        (httpx.post(url, json={"messages": MESSAGES}), 400),
        (httpx.post(url, content=b"x" * (10 * 1024 * 1024 + 1)), 413),
    ]
    for response, status in cases:
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["message"]
    with pytest.raises(openai.NotFoundError):
        client(gateway).chat.completions.create(model="nope", messages=MESSAGES)


def test_pod_dying_mid_stream_ends_that_stream_and_others_go_on(
    cluster: Cluster, operator: OperatorThread, gateway: GatewayThread
) -> None:
    engines = add_model(
        cluster, "fragile", pods=2, spec={"idle": {"after": "1h"}}, token_seconds=0.05
    )
    wait_for("two awake", lambda: gateway_view(gateway, "fragile").get("awake") == 2)
    api = client(gateway)
    stream = api.chat.completions.create(
        model="fragile", messages=MESSAGES, max_tokens=200, stream=True
    )
    chunks = iter(stream)
    next(chunks)
    victim = next(e for e in engines if e.running)
    killer = threading.Thread(target=cluster.sim.kill, args=(victim,))
    killer.start()
    with pytest.raises(openai.APIError) as caught:
        for _ in chunks:
            pass
    killer.join()
    assert "failed while answering" in str(caught.value)

    # The dead pod still carries its awake label; the gateway fails over on connect errors.
    for _ in range(4):
        reply = api.chat.completions.create(model="fragile", messages=MESSAGES, max_tokens=2)
        assert reply.choices[0].message.content == "lorem ipsum"

    # Not streaming: the survivor dies during the answer, and the client gets a clear 502.
    (survivor,) = (e for e in engines if e is not victim)
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(
            api.chat.completions.create, model="fragile", messages=MESSAGES, max_tokens=200
        )
        wait_for("the request running", lambda: survivor.running)
        cluster.sim.kill(survivor)
        with pytest.raises(openai.InternalServerError) as failed:
            pending.result(10)
    assert failed.value.status_code == 502
    assert "failed while answering" in failed.value.message
