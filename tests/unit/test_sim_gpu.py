"""Simulated engines that share a GPU: start refused, wake out of memory, what sleep keeps."""

from __future__ import annotations

import asyncio
import itertools
import re
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from waits import until

from snooze.sim import EngineConfig, SimulatedDevice, SimulatedEngine, SimulatorHost
from snooze.sim.device import GIB
from snooze.sim.host import AddressUnavailable, EngineDoesNotFit, EnginePool

# Port 0 everywhere: other suites may run engines on the same loopback addresses at once.
_hosts = (f"127.78.{i // 250}.{i % 250 + 1}" for i in itertools.count())
# A 30 GiB engine: 10 GiB of weights, 19 of KV cache, 1 that sleep keeps.
ENGINE = EngineConfig(
    model="m",
    port=0,
    device="gpu",
    gpu_memory_gib=10,
    kv_cache_gib=19,
    asleep_memory_gib=1,
    sleep_seconds=0.01,
    wake_seconds=0.01,
    kv_wake_seconds=0.0,
    reload_seconds=0.01,
    token_seconds=0.0,
    max_tokens_default=4,
    start_retry_seconds=0.05,
)
START_REFUSED = (
    "ValueError: Free memory on device cuda:0 (10.0/70.0 GiB) on startup is less than desired"
    " GPU memory utilization (0.42857142857142855, 30.0 GiB). Decrease GPU memory utilization"
    " or reduce GPU memory used by other processes."
)
WAKE_OOM = {
    "error": {
        "message": "Call to wake_up method failed: CUDA Error: out of memory at <path>:163",
        "type": "InternalServerError",
        "param": None,
        "code": 500,
    }
}


# Read from vLLM 0.33: CacheConfig().metrics_info() (vllm/config/cache.py) plus `engine`.
CACHE_CONFIG_LABELS = [
    "block_size",
    "user_specified_block_size",
    "kv_cache_layout",
    "prefix_match_unit",
    "gpu_memory_utilization",
    "cache_dtype",
    "is_attention_free",
    "num_gpu_blocks_override",
    "sliding_window",
    "enable_prefix_caching",
    "prefix_caching_hash_algo",
    "prefix_cache_retention_interval",
    "kv_cache_dtype_skip_layers",
    "mamba_page_size_padded",
    "skip_page_size_padded",
    "mamba_block_size",
    "mamba_cache_dtype",
    "mamba_ssm_cache_dtype",
    "mamba_cache_mode",
    "enable_mamba_shared_prefix_checkpoint",
    "replayssm_buffer_len",
    "use_replayssm",
    "use_kda_recoverssm",
    "num_gpu_blocks",
    "num_cpu_blocks",
    "simple_cpu_offload_num_blocks",
    "effective_attention_block_size",
    "kv_cache_size_tokens",
    "kv_cache_max_concurrency",
    "hash_block_size",
    "cache_hit_alignment_tokens",
    "kv_sharing_fast_prefill",
    "swa_bounded_replay",
    "kv_cache_memory_bytes",
    "kv_offloading_size",
    "kv_offloading_backend",
    "_block_size_resolved",
    "engine",
]


def engine_config(**changes: Any) -> EngineConfig:
    return replace(ENGINE, host=next(_hosts), **changes)


@pytest.fixture
def host() -> Iterator[SimulatorHost]:
    with SimulatorHost() as running:
        running.add_device(name="gpu", memory_gib=70)
        yield running


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=5) as client:
        yield client


def gib(nbytes: int) -> float:
    return nbytes / GIB


async def complete(http: httpx.AsyncClient, engine: SimulatedEngine) -> httpx.Response:
    return await http.post(f"{engine.url}/v1/completions", json={"model": "m", "prompt": "hi"})


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_four_engines_of_30_gib_on_70_gib(
    host: SimulatorHost, http: httpx.AsyncClient
) -> None:
    device = host.devices["gpu"]
    a, b, c, d = host.add_many(engine_config() for _ in range(4))
    assert [e.loaded for e in (a, b, c, d)] == [True, True, False, False]
    assert (gib(device.used_bytes), gib(device.free_bytes)) == (60, 10)

    # The two that found no room answer as a crash-looping vLLM would be seen by a probe.
    for engine in (c, d):
        assert (await http.get(f"{engine.url}/health")).status_code == 503
        refused = await complete(http, engine)
        assert refused.status_code == 503
        assert refused.json()["error"]["message"] == START_REFUSED
        assert engine.restarts >= 1 and engine.gpu_memory_bytes == 0
    assert device.oom_total >= 2  # (c and d keep retrying: the counts grow meanwhile)

    # Level 1 frees all but what sleep keeps; one waiting engine takes the room (30 GiB).
    assert (await http.post(f"{a.url}/sleep", params={"level": 1})).status_code == 200
    assert gib(a.gpu_memory_bytes) == 1 and gib(a.host_memory_bytes) == 10
    await until(lambda: c.loaded or d.loaded)
    started, waiting = (c, d) if c.loaded else (d, c)
    assert (await http.get(f"{started.url}/health")).status_code == 200
    assert (await complete(http, started)).status_code == 200
    assert (gib(device.used_bytes), gib(device.free_bytes)) == (61, 9)
    assert not waiting.loaded and gib(waiting.gpu_memory_bytes) == 0

    # Waking `a` now needs 10 GiB of weights, and 9 are free: vLLM's out-of-memory 500.
    woke = await http.post(f"{a.url}/wake_up")
    assert (woke.status_code, woke.json()) == (500, WAKE_OOM)
    assert (await http.get(f"{a.url}/is_sleeping")).json() == {"is_sleeping": True}
    assert (await http.get(f"{a.url}/health")).status_code == 200
    assert a.memory.oom_total == {"start": 0, "wake": 1} and gib(a.gpu_memory_bytes) == 1
    hanging = asyncio.create_task(complete(http, a))
    await until(lambda: a.waiting == 1)
    assert not hanging.done()

    # Make room and the same wake succeeds; the request runs. The waiting engine's pod goes
    # first, or it would take the room (it retries all the time); level 2 frees host RAM too.
    host.kill(waiting)
    assert (await http.post(f"{b.url}/sleep", params={"level": 2})).status_code == 200
    assert gib(b.gpu_memory_bytes) == 1 and b.host_memory_bytes == 0
    assert (await http.post(f"{a.url}/wake_up")).json()["status"] == "awake"
    assert (await hanging).status_code == 200
    # Awake, it still holds its pinned copy: PyTorch caches the blocks the wake freed.
    assert gib(a.gpu_memory_bytes) == 30 and gib(a.host_memory_bytes) == 10
    assert (gib(device.used_bytes), gib(device.free_bytes)) == (30 + 1 + 30, 9)


async def test_pinned_host_memory_outlives_the_wake_until_the_process_ends(
    host: SimulatorHost, http: httpx.AsyncClient
) -> None:
    """As vLLM's CuMemAllocator on PyTorch's caching host allocator: the first level-1 sleep
    pins a copy of the weights; the wake drops the tensor, but its blocks stay cached in the
    process, and the next level-1 sleep reuses them. Only the process's end gives them back."""
    engine = host.add(engine_config(sleep_seconds=0.05, pinning_share=0.8))
    assert engine.host_memory_bytes == 0
    assert engine.sleep_duration(1) == 0.05  # the first level-1 sleep pins, then copies
    assert engine.sleep_duration(2) == engine.config.level2_sleep_seconds
    await http.post(f"{engine.url}/sleep", params={"level": 2})
    assert engine.host_memory_bytes == 0  # level 2 copies nothing
    await http.post(f"{engine.url}/wake_up")
    await http.post(f"{engine.url}/collective_rpc", json={"method": "reload_weights"})
    for level in (1, 1, 2):
        await http.post(f"{engine.url}/sleep", params={"level": level})
        assert gib(engine.host_memory_bytes) == 10, level
        assert (await http.post(f"{engine.url}/wake_up")).is_success
        if level == 2:
            await http.post(f"{engine.url}/collective_rpc", json={"method": "reload_weights"})
        assert gib(engine.host_memory_bytes) == 10  # awake, and still pinned
        assert engine.sleep_duration(1) == pytest.approx(0.01)  # later ones only copy
    text = (await http.get(f"{engine.url}/metrics")).text
    assert (
        samples(text)[
            ("snooze_sim_host_memory_used_bytes", frozenset({("model_name", "m"), ("engine", "0")}))
        ]
        == 10 * GIB
    )
    fresh = host.restart(engine)
    assert fresh.host_memory_bytes == 0 and engine.host_memory_bytes == 0
    assert fresh.sleep_duration(1) == 0.05


async def test_a_wake_that_fits_the_weights_but_not_the_kv_cache(
    host: SimulatorHost, http: httpx.AsyncClient
) -> None:
    device = host.devices["gpu"]
    sleeper = host.add(engine_config())
    await http.post(f"{sleeper.url}/sleep", params={"level": 1})
    # 20 GiB of weights and KV cache for another engine leave 70 - 1 - 50 = 19 GiB free.
    host.add(engine_config(gpu_memory_gib=20, kv_cache_gib=29))
    assert gib(device.free_bytes) == 19

    failed = await http.post(f"{sleeper.url}/wake_up")
    assert failed.json() == WAKE_OOM
    # As CuMemAllocator: the weights were mapped before the KV cache failed, and stay mapped.
    assert sleeper.weights_on_gpu and not sleeper.kv_on_gpu and sleeper.is_sleeping
    assert gib(sleeper.gpu_memory_bytes) == 11 and gib(sleeper.host_memory_bytes) == 10
    assert gib(device.free_bytes) == 9

    await http.post(f"{host.engines[1].url}/sleep", params={"level": 1})
    assert (await http.post(f"{sleeper.url}/wake_up")).json()["status"] == "awake"
    assert gib(sleeper.gpu_memory_bytes) == 30


async def test_tagged_wake_out_of_memory_then_level_0_keeps_everything(
    host: SimulatorHost, http: httpx.AsyncClient
) -> None:
    device = host.devices["gpu"]
    first, second = host.add_many([engine_config(), engine_config()])
    await http.post(f"{first.url}/sleep", params={"level": 2})
    host.kill(second)  # its pod is gone: all of its memory comes back
    assert gib(device.used_bytes) == 1
    filler = host.add(engine_config(gpu_memory_gib=40, kv_cache_gib=24))  # 65 GiB
    assert gib(device.free_bytes) == 4
    weights = await http.post(f"{first.url}/wake_up", params={"tags": "weights"})
    assert weights.json() == WAKE_OOM and not first.weights_on_gpu
    host.kill(filler)
    assert (await http.post(f"{first.url}/wake_up", params={"tags": "weights"})).json() == {
        "status": "sleeping",
        "tags": ["weights"],
    }
    assert (
        await http.post(f"{first.url}/collective_rpc", json={"method": "reload_weights"})
    ).is_success
    assert (await http.post(f"{first.url}/wake_up", params={"tags": "kv_cache"})).json()[
        "status"
    ] == "awake"
    # Level 0 pauses the scheduler only: nothing leaves the GPU.
    await http.post(f"{first.url}/sleep", params={"level": 0})
    assert first.is_sleeping and gib(first.gpu_memory_bytes) == 30


async def test_metrics_of_a_shared_engine(host: SimulatorHost, http: httpx.AsyncClient) -> None:
    first, _, waiting = host.add_many(engine_config() for _ in range(3))
    await http.post(f"{first.url}/sleep", params={"level": 1})
    # A wake without room: the third engine took it meanwhile.
    await until(lambda: waiting.loaded)
    await http.post(f"{first.url}/wake_up")
    text = (await http.get(f"{first.url}/metrics")).text
    found = samples(text)
    base = {("model_name", "m"), ("engine", "0")}
    assert found[("snooze_sim_gpu_memory_used_bytes", frozenset(base))] == GIB
    assert found[("snooze_sim_host_memory_used_bytes", frozenset(base))] == 10 * GIB
    for operation, count in (("start", 0), ("wake", 1)):
        key = frozenset(base | {("operation", operation)})
        assert found[("snooze_sim_gpu_oom_total", key)] == count
    device = {("device", "gpu")}
    assert found[
        ("snooze_sim_gpu_device_memory_bytes", frozenset(device | {("state", "used")}))
    ] == (61 * GIB)
    assert found[
        ("snooze_sim_gpu_device_memory_bytes", frozenset(device | {("state", "free")}))
    ] == (9 * GIB)
    assert found[("snooze_sim_gpu_device_oom_total", frozenset(device))] >= 2  # start and wake
    [info] = [labels for (name, labels) in found if name == "vllm:cache_config_info"]
    assert dict(info)["gpu_memory_utilization"] == str(30 / 70)
    assert found[("vllm:cache_config_info", info)] == 1
    # vLLM 0.33's labels, in CacheConfig's order, then `engine`.
    [line] = [line for line in text.splitlines() if line.startswith("vllm:cache_config_info{")]
    assert re.findall(r'[{,]([a-z_]+)="', line) == CACHE_CONFIG_LABELS
    assert dict(info)["engine"] == "0" and dict(info)["num_gpu_blocks"] == str(19 * 512)

    # name[] matches sample names, as prometheus_client does: counters by their `_total`.
    async def only(*names: str) -> set[str]:
        text = (await http.get(f"{first.url}/metrics/", params={"name[]": list(names)})).text
        return {name for name, _ in samples(text)}

    assert await only("snooze_sim_gpu_oom") == set()
    assert await only("snooze_sim_gpu_oom_total", "vllm:cache_config_info") == {
        "snooze_sim_gpu_oom_total",
        "vllm:cache_config_info",
    }
    assert await only("snooze_sim_gpu_device_memory_bytes") == {
        "snooze_sim_gpu_device_memory_bytes"
    }


async def test_an_engine_that_cannot_start_shows_only_the_simulator_metrics(
    host: SimulatorHost, http: httpx.AsyncClient
) -> None:
    *_, refused = host.add_many(engine_config() for _ in range(3))
    await until(lambda: refused.restarts >= 2)
    text = (await http.get(f"{refused.url}/metrics")).text
    names = {family.name for family in text_string_to_metric_families(text)}
    assert names == {
        "snooze_sim_gpu_memory_used_bytes",
        "snooze_sim_host_memory_used_bytes",
        "snooze_sim_gpu_oom",
        "snooze_sim_gpu_device_memory_bytes",
        "snooze_sim_gpu_device_oom",
    }
    found = samples(text)
    key = frozenset({("model_name", "m"), ("engine", "0"), ("operation", "start")})
    assert found[("snooze_sim_gpu_oom_total", key)] == refused.memory.oom_total["start"] >= 2
    for path in ("/is_sleeping", "/v1/models"):
        assert (await http.request("GET", refused.url + path)).status_code == 503
    assert (await http.post(f"{refused.url}/sleep")).status_code == 503


async def test_engines_on_two_devices_in_one_process(http: httpx.AsyncClient) -> None:
    devices = [SimulatedDevice(name=f"gpu{i}", memory_gib=40) for i in range(2)]
    with SimulatorHost(devices) as host:
        engines = host.add_many(engine_config(device=f"gpu{i % 2}") for i in range(4))
        assert [e.loaded for e in engines] == [True, True, False, False]
        assert [e.device.name for e in engines] == ["gpu0", "gpu1", "gpu0", "gpu1"]
        assert all(gib(d.used_bytes) == 30 for d in devices)
        host.kill(engines[1])
        await until(lambda: engines[3].loaded)
        assert not engines[2].loaded and gib(devices[1].used_bytes) == 30


async def test_an_engine_alone_on_its_device_reports_vllms_default_share(
    http: httpx.AsyncClient,
) -> None:
    pool = EnginePool()
    engine = await pool.add(engine_config(device=None))
    try:
        text = (
            await http.get(f"{engine.url}/metrics/", params={"name[]": "vllm:cache_config_info"})
        ).text
        [family] = text_string_to_metric_families(text)
        assert family.samples[0].labels["gpu_memory_utilization"] == "0.92"
        assert engine.device.name != "gpu" and gib(engine.gpu_memory_bytes) == 30
    finally:
        await pool.close()


async def test_mistakes_say_what_to_change() -> None:
    pool = EnginePool([SimulatedDevice(name="small", memory_gib=20)])
    with pytest.raises(
        ValueError, match=r"no device named 'gpu' in this pool \(known: \['small'\]\)"
    ):
        await pool.add(engine_config())
    with pytest.raises(
        EngineDoesNotFit, match=r"footprint \(30.00 GiB.*exceeds device 'small' \(20.00 GiB\)"
    ):
        await pool.add(engine_config(device="small"))
    with pytest.raises(ValueError, match="memory_gib must be positive"):
        SimulatedDevice(name="x", memory_gib=0)
    assert pool.engines == [] and pool.devices["small"].used_bytes == 0


async def test_one_busy_address_leaves_no_engine_of_the_batch_behind() -> None:
    first, second = next(_hosts), next(_hosts)
    with socket.socket() as taken:
        taken.bind((second, 0))
        taken.listen()
        port = taken.getsockname()[1]
        device = SimulatedDevice(name="gpu", memory_gib=70)
        pool = EnginePool([device])
        configs = [replace(ENGINE, host=host, port=port) for host in (first, second)]
        with pytest.raises(AddressUnavailable, match=f"cannot serve on {second}:{port}: the"):
            await pool.add_many(configs)
    assert pool.engines == [] and device.used_bytes == 0
    with socket.socket() as probe:
        assert probe.connect_ex((first, port)) != 0  # nothing listens there any more
