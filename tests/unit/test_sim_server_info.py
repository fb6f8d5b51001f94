"""The simulator's GET /server_info, release by release as read in vLLM's wheels: none before
0.8.5, the configuration as text to 0.10.2, as JSON on `?config_format=json` from 0.11.0, and
only in dev mode."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from .test_sim_releases import serving


@pytest.mark.parametrize(
    ("version", "asked", "expected"),
    [
        ("0.8.4", {}, 404),
        ("0.8.5", {}, "text"),
        ("0.10.2", {"config_format": "json"}, "text"),  # the parameter is not read yet
        ("0.11.0", {}, "text"),
        ("0.11.0", {"config_format": "json"}, "json"),
        ("0.33.0", {"config_format": "json"}, "json"),
        ("0.33.0", {"config_format": "yaml"}, 400),  # vLLM's validation handler
    ],
)
async def test_server_info_by_release(version: str, asked: dict[str, str], expected: Any) -> None:
    async with serving(vllm_version=version, tensor_parallel_size=2) as (_, http):
        answer = await http.get("/server_info", params=asked)
    if isinstance(expected, int):
        assert answer.status_code == expected
        return
    assert answer.status_code == 200
    config = answer.json()["vllm_config"]
    if expected == "text":
        assert isinstance(config, str)
        assert "tensor_parallel_size=2, pipeline_parallel_size=1" in config
        assert "sleep" not in config  # the text form does not say it
    else:
        assert config["model_config"]["enable_sleep_mode"] is True
        assert config["parallel_config"]["tensor_parallel_size"] == 2
        assert config["lora_config"] is None


async def test_server_info_needs_dev_mode() -> None:
    async with serving(dev_mode=False) as (_, http):
        answer = await http.get("/server_info", params={"config_format": "json"})
    assert answer.status_code == 404 and answer.json() == {"detail": "Not Found"}


async def test_the_environment_parts_come_with_their_releases() -> None:
    keys: dict[str, set[str]] = {}
    for version in ("0.13.0", "0.14.0", "0.20.0"):
        async with serving(vllm_version=version) as (_, http):
            answer: httpx.Response = await http.get("/server_info")
        keys[version] = set(answer.json())
    assert keys == {
        "0.13.0": {"vllm_config"},
        "0.14.0": {"vllm_config", "vllm_env"},
        "0.20.0": {"vllm_config", "vllm_env", "system_env"},
    }
