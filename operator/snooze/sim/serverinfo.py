"""GET /server_info, as the simulated release serves it (dev mode only): how the engine was
started. Read in vLLM's wheels: 0.8.4 has no such route; 0.8.5 to 0.10.2 answer the
configuration as text (`str(VllmConfig)`, `entrypoints/openai/api_server.py`), which names the
parallel sizes but not sleep mode; from 0.11.0 `?config_format=json` answers it as JSON
(pydantic's dump of VllmConfig: `model_config.enable_sleep_mode`, `parallel_config`,
`lora_config`); `vllm_env` joins in 0.14.0 and `system_env` by 0.20.0 (0.15 to 0.19 were not
read: the simulator adds it from 0.20.0) (`serve/instrumentator/server_info.py`, in 0.33.0
`serve/dev/server_info/api_router.py`)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from snooze.sim.engine import SimulatedEngine
from snooze.sim.responses import ENGINE_KEY, invalid_field

FIRST = (0, 8, 5)
JSON_FROM = (0, 11, 0)
VLLM_ENV_FROM = (0, 14, 0)
SYSTEM_ENV_FROM = (0, 20, 0)


def add_routes(app: web.Application, engine: SimulatedEngine) -> None:
    if engine.config.dev_mode and engine.contract.release >= FIRST:
        app.router.add_get("/server_info", server_info)


async def server_info(request: web.Request) -> web.Response:
    engine: SimulatedEngine = request.app[ENGINE_KEY]
    release = engine.contract.release
    asked = request.query.get("config_format", "text")
    if release >= JSON_FROM and asked not in ("text", "json"):
        return invalid_field(
            engine, "query", "config_format", "Input should be 'text' or 'json'", asked
        )
    config: Any = as_json(engine) if release >= JSON_FROM and asked == "json" else as_text(engine)
    body: dict[str, Any] = {"vllm_config": config}
    if release >= VLLM_ENV_FROM:
        body["vllm_env"] = {"VLLM_SERVER_DEV_MODE": True}
    if release >= SYSTEM_ENV_FROM:
        body["system_env"] = {"os": "simulated", "is_cuda_available": False}
    return web.json_response(body)


def as_text(engine: SimulatedEngine) -> str:
    """The start of `str(VllmConfig)`, as vLLM prints it."""
    cfg = engine.config
    return (
        f"model={cfg.model!r}, speculative_config=None, tokenizer={cfg.model!r}, "
        f"skip_tokenizer_init=False, tokenizer_mode=auto, revision=None, "
        f"tokenizer_revision=None, trust_remote_code=False, dtype=torch.bfloat16, "
        f"max_seq_len={cfg.max_model_len}, download_dir=None, load_format=auto, "
        f"tensor_parallel_size={cfg.tensor_parallel_size}, "
        f"pipeline_parallel_size={cfg.pipeline_parallel_size}, data_parallel_size=1, "
        f"disable_custom_all_reduce=False, quantization=None, enforce_eager=False, "
        f"kv_cache_dtype=auto, device_config=cuda, seed=0, served_model_name={cfg.model}, "
        f"enable_prefix_caching=True"
    )


def as_json(engine: SimulatedEngine) -> dict[str, Any]:
    """The parts of VllmConfig's JSON dump a client reads; the simulator always sleeps."""
    cfg = engine.config
    return {
        "model_config": {
            "model": cfg.model,
            "served_model_name": cfg.model,
            "max_model_len": cfg.max_model_len,
            "dtype": "torch.bfloat16",
            "enable_sleep_mode": True,
        },
        "cache_config": {
            "gpu_memory_utilization": engine.memory.utilization,
            "cache_dtype": "auto",
        },
        "parallel_config": {
            "tensor_parallel_size": cfg.tensor_parallel_size,
            "pipeline_parallel_size": cfg.pipeline_parallel_size,
            "data_parallel_size": 1,
        },
        "lora_config": None,
    }
