"""A pod's `vllm serve` arguments as vLLM's parser reads them: LoRA, tensor and pipeline
parallel, sleep mode, in every spelling vLLM accepts."""

from __future__ import annotations

from typing import Any

import pytest

from snooze.kube.pods import pod_info
from snooze.kube.serveargs import ServeArgs, serve_args


def spec(*containers: dict[str, Any]) -> dict[str, Any]:
    return {"containers": list(containers)}


@pytest.mark.parametrize(
    ("container", "expected"),
    [
        ({"args": ["serve", "m"]}, ServeArgs()),
        ({"args": ["serve", "m", "--enable-lora"]}, ServeArgs(lora=True)),
        ({"args": ["--enable-lora=true"]}, ServeArgs(lora=True)),
        ({"args": ["--enable-lora=false"]}, ServeArgs()),
        ({"args": ["--enable-lora", "--no-enable-lora"]}, ServeArgs()),
        ({"args": ["--lora-modules", "sql=/adapters/sql"]}, ServeArgs(lora=True)),
        ({"args": ["--enable_lora"]}, ServeArgs(lora=True)),
        ({"args": ["--tensor-parallel-size", "4"]}, ServeArgs(tensor_parallel=4)),
        ({"args": ["--tensor-parallel-size=2"]}, ServeArgs(tensor_parallel=2)),
        ({"args": ["-tp", "8", "-pp", "2"]}, ServeArgs(tensor_parallel=8, pipeline_parallel=2)),
        ({"args": ["--tensor_parallel_size", "2"]}, ServeArgs(tensor_parallel=2)),
        ({"args": ["--pipeline-parallel-size=3"]}, ServeArgs(pipeline_parallel=3)),
        ({"args": ["-tp", "many"]}, ServeArgs()),  # not a number: vLLM would refuse to start
        ({"args": ["-tp", "0"]}, ServeArgs()),
        ({"args": ["-tp", "99999999"]}, ServeArgs()),
        (
            {"command": ["sh", "-c", "exec vllm serve m --enable-lora -tp 2"]},
            ServeArgs(lora=True, tensor_parallel=2),
        ),
        ({"command": ["sh", "-c", "vllm serve 'unclosed -tp 2"]}, ServeArgs(tensor_parallel=2)),
        ({"args": ["serve", "m", "--enable-sleep-mode"]}, ServeArgs(sleep_mode=True)),
        ({"args": ["--enable_sleep_mode"]}, ServeArgs(sleep_mode=True)),
        ({"args": ["--enable-sleep-mode", "--no-enable-sleep-mode"]}, ServeArgs(sleep_mode=False)),
        ({"args": ["--config", "/etc/vllm/serve.yaml"]}, ServeArgs(config_file=True)),
        ({"args": ["--config=/etc/vllm/serve.yaml"]}, ServeArgs(config_file=True)),
    ],
)
def test_the_arguments_are_read_as_vllm_reads_them(
    container: dict[str, Any], expected: ServeArgs
) -> None:
    assert serve_args(spec({"name": "vllm", **container})) == expected


def test_a_pod_carries_them() -> None:
    body = {
        "metadata": {"name": "p", "namespace": "n", "uid": "u"},
        "spec": spec({"name": "vllm", "args": ["serve", "m", "-tp", "2", "--enable-lora"]}),
    }
    assert pod_info(body).serve == ServeArgs(lora=True, tensor_parallel=2)
    assert pod_info({"metadata": {"name": "p"}}).serve == ServeArgs()


def test_what_is_not_a_container_is_ignored() -> None:
    assert serve_args({"containers": ["junk", {"args": ["-tp", "2"]}]}) == ServeArgs(
        tensor_parallel=2
    )
