"""docs/sglang.md's sandbox walkthrough with an SGLang model, run as printed: each command in
the terminal the page gives it, through bash, with the real kubectl and curl, as
test_walkthrough.py runs getting-started's (its terminals and machine are reused)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from .test_walkthrough import Machine, Session, Step, page_steps

pytestmark = pytest.mark.needs("kubectl", "curl", "bash")

ROOT = Path(__file__).resolve().parents[2]
PAGE = "docs/sglang.md"
ASK = (
    "curl -s localhost:8080/v1/chat/completions -H 'Content-Type: application/json' \\\n"
    """  -d '{"model": "qa", "messages": [{"role": "user", "content": "hi"}]}'"""
)
WAKE = ASK.replace("curl -s", "curl -si")
WAIT = "kubectl wait im/qa --for=jsonpath='{.status.phase}'=%s --timeout=%s"
MET = r"inferencemodel.snooze.dev/qa condition met"
STEPS = [
    Step(
        1,
        "snooze sandbox --port 6443 --kubeconfig /tmp/snooze-kubeconfig",
        forever=True,
        shows=(r"serving http://127\.0\.0\.1:6443",),
    ),
    Step(
        2,
        "snooze operator --kubeconfig /tmp/snooze-kubeconfig --probe-interval 2",
        forever=True,
        shows=(r"once their CRDs are installed",),
    ),
    Step(
        3,
        "snooze sim --engine sglang --host 127.0.0.4 --port 30000 --model qa",
        forever=True,
        shows=(r"127\.0\.0\.4:30000",),
    ),
    Step(
        4,
        "snooze gateway --kubeconfig /tmp/snooze-kubeconfig --port 8080",
        forever=True,
        shows=(r"gateway listening on 0\.0\.0\.0:8080",),
    ),
    Step(5, "export KUBECONFIG=/tmp/snooze-kubeconfig KUBECACHEDIR=$(mktemp -d)"),
    Step(5, "kubectl apply -f crds/", shows=(r"inferencemodels.snooze.dev created",)),
    Step(
        5,
        "kubectl apply -f examples/sandbox/qa-sglang.yaml",
        shows=(r"pod/qa-0 created", r"inferencemodel.snooze.dev/qa created"),
    ),
    Step(5, WAIT % ("Awake", "2m"), shows=(MET,)),
    Step(5, ASK, shows=(r'"object": ?"chat.completion"', r'"model": ?"qa"')),
    Step(5, WAIT % ("Asleep", "3m"), shows=(MET,)),
    Step(
        5,
        "kubectl get pod qa-0 -o jsonpath='{.metadata.annotations.snooze\\.dev/released}{\"\\n\"}'",
        shows=(r"(?m)^0:cuda_graph,kv_cache,paused,weights$",),
    ),
    Step(
        5,
        WAKE,
        shows=(r"HTTP/1.1 200", r"(?i)x-snooze-held-seconds: \d", r'"object": ?"chat.completion"'),
    ),
    Step(5, WAIT % ("Awake", "1m"), shows=(MET,)),
    Step(
        5,
        "kubectl events --for im/qa",
        shows=tuple(
            rf"{reason}\s+InferenceModel/qa\s.*qa-0"
            for reason in ("Draining", "Slept", "Waking", "Woke")
        ),
    ),
]


class SGLangMachine(Machine):
    @staticmethod
    def engines() -> list[tuple[str, int]]:
        return [("127.0.0.4", 30000)]


@pytest.fixture
def machine(tmp_path: Path) -> Iterator[Machine]:
    machine = SGLangMachine(tmp_path)
    yield machine
    machine.close()


def test_the_page_prints_these_steps() -> None:
    page = (ROOT / PAGE).read_text()
    assert page_steps(page) == [(s.terminal, s.command) for s in STEPS]


def test_the_sglang_walkthrough_runs_as_printed(machine: Machine, tmp_path: Path) -> None:
    page = (ROOT / PAGE).read_text()
    assert page_steps(page) == [(s.terminal, s.command) for s in STEPS]
    machine.check_free()
    session = Session(machine, tmp_path)
    try:
        session.run(STEPS)
        operator = session.terminal(2).output()
        for said in (
            "Draining: qa-0: idle",
            "Slept: qa-0: asleep",
            "Waking: qa-0:",
            "Woke: qa-0: awake",
        ):
            assert said in operator, f"{said}{session.logs()}"
        for quiet in (1, 3, 4):
            said = session.terminal(quiet).output()
            assert not re.search(r" (WARNING|ERROR) ", said), f"terminal {quiet}:\n{said}"
    finally:
        session.stop()
