"""`snooze sim` run as a user runs it: a process, its flags, its answers and its errors."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import docs_pages
import httpx
import pytest
from ports import free_port
from prometheus_client.parser import text_string_to_metric_families
from waits import wait_for

SNOOZE_SIM = [sys.executable, "-m", "snooze.cli", "sim"]
GIB = 1024**3


def answers(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=2).status_code
    except httpx.TransportError:
        return None


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []

    def start(*args: str) -> subprocess.Popen[bytes]:
        log = (tmp_path / f"sim-{len(started)}.log").open("wb")
        process = subprocess.Popen([*SNOOZE_SIM, *args], stdout=log, stderr=subprocess.STDOUT)
        started.append(process)
        return process

    yield start
    for process in started:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()


def test_shared_gpu_and_repeated_models(sim: Callable[..., subprocess.Popen[bytes]]) -> None:
    hosts = ["127.79.0.1", "127.79.0.2", "127.79.0.3"]
    port = free_port(hosts[0])
    sim(
        *("--host", hosts[0], "--port", str(port), "--count", "3"),
        *("--model", "chat", "--model", "code"),
        *("--shared-gpu-gib", "70", "--gpu-memory-gib", "10", "--kv-cache-gib", "19"),
        *("--start-retry-seconds", "0.1", "--sleep-seconds", "0", "--wake-seconds", "0"),
    )
    urls = [f"http://{host}:{port}" for host in hosts]
    wait_for(
        "every engine's /metrics", lambda: all(answers(f"{url}/metrics") == 200 for url in urls), 20
    )
    # Engine i serves the i-th name, cycling; two 30 GiB engines fit in 70 GiB, the third waits.
    served = [httpx.get(f"{url}/v1/models").json()["data"][0]["id"] for url in urls[:2]]
    assert served == ["chat", "code"]
    assert [answers(f"{url}/health") for url in urls] == [200, 200, 503]
    refused = httpx.post(f"{urls[2]}/v1/completions", json={"model": "chat", "prompt": "x"})
    assert refused.status_code == 503
    assert refused.json()["error"]["message"].startswith(
        "ValueError: Free memory on device cuda:0 (10.0/70.0 GiB) on startup is less than"
        " desired GPU memory utilization (0.42857142857142855, 30.0 GiB)."
    )

    assert httpx.post(f"{urls[0]}/sleep", params={"level": 1}).status_code == 200
    wait_for("the third engine found room", lambda: answers(f"{urls[2]}/health") == 200, 20)
    assert httpx.get(f"{urls[2]}/v1/models").json()["data"][0]["id"] == "chat"
    woke = httpx.post(f"{urls[0]}/wake_up")
    assert woke.status_code == 500 and "CUDA Error: out of memory" in woke.text

    metrics = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(
            httpx.get(
                f"{urls[0]}/metrics/",
                params={"name[]": ["snooze_sim_gpu_device_memory_bytes", "vllm:cache_config_info"]},
            ).text
        )
        for s in family.samples
    }
    assert {name for name, _ in metrics} == {
        "snooze_sim_gpu_device_memory_bytes",
        "vllm:cache_config_info",
    }
    used = (("device", "gpu0"), ("state", "used"))
    assert metrics[("snooze_sim_gpu_device_memory_bytes", used)] == 61 * GIB


def test_busy_second_address_stops_the_first_engine_too() -> None:
    hosts = ["127.79.2.1", "127.79.2.2"]
    port = free_port(hosts[0])
    with socket.socket() as taken:
        taken.bind((hosts[1], port))
        taken.listen()
        done = subprocess.run(
            [*SNOOZE_SIM, "--host", hosts[0], "--port", str(port), "--count", "2"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"cannot serve an engine on {hosts[1]}:{port}: the port is in use" in done.stderr


def test_engines_of_several_processes_share_a_device_file(
    sim: Callable[..., subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    """Three `snooze sim` processes (three pods of one node) on one 70 GiB device file: two
    30 GiB engines fit, the third waits; killing one gives its memory back, as a GPU does."""
    device = tmp_path / "gpu-0"
    port = free_port("127.0.0.1")
    hosts = [f"127.81.{os.getpid() % 200}.{i + 1}" for i in range(3)]
    processes = [
        sim(
            *("--host", host, "--port", str(port), "--model", f"m{i}"),
            *("--shared-gpu-gib", "70", "--shared-gpu-file", str(device)),
            *("--gpu-memory-gib", "10", "--kv-cache-gib", "19", "--start-retry-seconds", "0.1"),
        )
        for i, host in enumerate(hosts)
    ]
    urls = [f"http://{host}:{port}" for host in hosts]
    wait_for(
        "every engine's /metrics", lambda: all(answers(f"{url}/metrics") == 200 for url in urls), 20
    )
    wait_for(
        "two loaded, one refused",
        lambda: sorted(answers(f"{url}/health") for url in urls) == [200, 200, 503],
        20,
    )
    waiting = next(url for url in urls if answers(f"{url}/health") == 503)
    first = next(i for i, url in enumerate(urls) if url != waiting)
    processes[first].kill()  # SIGKILL: no chance to give anything back itself
    wait_for("the waiting engine loaded", lambda: answers(f"{waiting}/health") == 200, 20)


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (("--shared-gpu-file", "x"), "--shared-gpu-file needs --shared-gpu-gib"),
        (("--shared-gpu-gib", "70", "--shared-gpu-file", "/proc/gpu"), "cannot use /proc/gpu"),
    ],
)
def test_a_device_file_that_cannot_serve_is_refused(args: tuple[str, ...], complaint: str) -> None:
    done = subprocess.run(
        [*SNOOZE_SIM, "--host", "127.79.3.2", "--port", "0", *args],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert done.stderr.startswith(f"snooze sim: {complaint}") and done.stderr.count("\n") == 1


def test_a_device_file_of_another_size_is_refused(tmp_path: Path) -> None:
    device = tmp_path / "gpu-0"
    first = [*SNOOZE_SIM, "--host", "127.79.3.3", "--port", "0", "--shared-gpu-gib", "70"]
    running = subprocess.Popen([*first, "--shared-gpu-file", str(device)])
    try:
        wait_for("the device file", device.exists, 20)
        done = subprocess.run(
            [*SNOOZE_SIM, "--host", "127.79.3.4", "--port", "0", "--shared-gpu-gib", "80",
             "--shared-gpu-file", str(device)],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
    finally:
        running.terminate()
        running.wait(10)
    assert done.returncode == 2
    assert "holds a device of 70 GiB, not 80 GiB" in done.stderr


def test_an_engine_larger_than_the_shared_gpu_is_refused() -> None:
    done = subprocess.run(
        [*SNOOZE_SIM, "--host", "127.79.3.1", "--port", "0", "--shared-gpu-gib", "40"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("snooze sim: engine 127.79.3.1: its footprint (67.00 GiB")
    assert "raise --shared-gpu-gib" in done.stderr and done.stderr.count("\n") == 1


@pytest.mark.parametrize(
    ("flag", "value", "complaint"),
    [
        ("--shared-gpu-gib", "0", "must be positive, not 0"),
        ("--count", "-1", "must be positive, not -1"),
        ("--host", "localhost", "not an IP address: 'localhost'"),
    ],
)
def test_bad_flags_are_refused_by_name(flag: str, value: str, complaint: str) -> None:
    done = subprocess.run([*SNOOZE_SIM, flag, value], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert f"argument {flag}: {complaint}" in done.stderr


def page_commands() -> list[str]:
    """The commands of docs/simulator.md's block on sharing a GPU, as printed."""
    section = docs_pages.section("docs/simulator.md", "## Several engines on one GPU")
    return docs_pages.commands(section)


def test_the_page_shared_gpu_commands_as_printed(tmp_path: Path) -> None:
    serve, scrape = page_commands()
    assert serve.startswith("snooze sim ") and scrape.startswith("curl ")
    hosts = [f"127.0.0.{20 + i}" for i in range(4)]
    if any(answers(f"http://{host}:8000/metrics") is not None for host in hosts):
        pytest.fail("something listens on 127.0.0.20-23:8000: stop it to run this test")
    # Through a shell, as a person types them; `snooze` is the one of this environment.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    log = (tmp_path / "readme-sim.log").open("wb")
    process = subprocess.Popen(["bash", "-c", f"exec {serve}"], env=env, stdout=log, stderr=log)
    try:
        wait_for(
            "every engine's /metrics",
            lambda: all(answers(f"http://{h}:8000/metrics") == 200 for h in hosts),
            20,
        )
        assert [answers(f"http://{h}:8000/health") for h in hosts] == [200, 200, 503, 503]
        shown = subprocess.run(
            ["bash", "-c", scrape], env=env, capture_output=True, text=True, timeout=30, check=True
        ).stdout
        values = {
            s.labels["state"]: s.value for s in next(text_string_to_metric_families(shown)).samples
        }
        assert values == {"used": 60 * GIB, "free": 10 * GIB}
    finally:
        process.terminate()
        process.wait(10)
