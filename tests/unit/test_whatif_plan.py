"""`snooze whatif plan`: the arithmetic of fitting models on a device, the search's estimate,
the search itself on traces whose answer is known, and the manifests it writes (valid as the
CRDs' own models read them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from snooze.api.gpupool import parse_pool_spec
from snooze.api.models import InferenceModelSpec
from snooze.cli import main
from snooze.whatif import manifests, plan, policies, trace
from snooze.whatif.latency import Latencies
from snooze.whatif.layout import PoolFlags
from snooze.whatif.pooling import Footprint

GIB = 2**30
SIZE = Footprint(memory=36 * GIB, asleep=2 * GIB, weights=34 * GIB)
SMALL = Footprint(memory=20 * GIB, asleep=GIB, weights=19 * GIB)


def test_what_fits_on_a_device() -> None:
    sizes = {"a": SIZE, "b": SIZE, "c": SIZE, "d": SMALL}
    # Each can wake beside the others asleep: 36 + 2 + 2 + 1 <= 80; two of 36 awake at once.
    assert plan.fits("abcd", sizes, 80 * GIB)
    assert plan.capacity("abcd", sizes, 80 * GIB) == 2
    assert plan.capacity("abd", sizes, 80 * GIB) == 3 - 1  # d (20) and one of 36: 36+20+2=58
    assert plan.capacity("ad", sizes, 80 * GIB) == 2
    assert not plan.fits("ab", sizes, 37 * GIB)
    assert plan.fits("a", sizes, 36 * GIB)


def test_crowding_counts_members_wanted_beyond_the_room() -> None:
    # Minutes 0..3: a in 0, 1, 2; b in 1, 2; c in 2, 3. Wanted at once: 1, 2, 3, 1.
    minutes = {"a": 0b0111, "b": 0b0110, "c": 0b1100}
    assert plan.crowding(["a", "b", "c"], minutes, 1) == 0 + 1 + 2 + 0
    assert plan.crowding(["a", "b", "c"], minutes, 2) == 1
    assert plan.crowding(["c", "a", "b"], minutes, 2) == 1
    assert plan.crowding(["a", "b", "c"], minutes, 3) == 0


def busy(model: str, start: float, end: float, every: float = 10.0) -> list[trace.Request]:
    count = int((end - start) // every)
    return [trace.Request(at=start + i * every, model=model) for i in range(count)]


def settings(target: float = 2.0, **kw: object) -> plan.PlanSettings:
    return plan.PlanSettings(
        device_memory=80 * GIB,
        sizes=dict.fromkeys("abcde", SIZE),
        target=target,
        pool=PoolFlags(min_residency=2.0),
        member=policies.parse("always-on").spec,
        latencies=Latencies(),
        measure_from=0.0,
        **kw,  # type: ignore[arg-type]
    )


def test_models_wanted_in_turns_share_one_device() -> None:
    # a and b in the first hour, c and d in the second: two at a time, two fit awake.
    requests = [
        *busy("a", 0, 3600), *busy("b", 5, 3600), *busy("c", 3600, 7200), *busy("d", 3605, 7200)
    ]  # fmt: skip
    found = plan.search(trace.Trace.of(requests), settings())
    assert found.groups == [frozenset("abcd")]
    assert found.worst <= 2.0
    # Every packing it tried is a point of the picture: 4 devices, then 3, 2, 1 (the plan).
    assert [c.devices for c in found.candidates] == [4, 3, 2, 1, 1]
    assert found.candidates[-1].chosen


def test_models_wanted_together_keep_devices_apart() -> None:
    # Three models busy at once all the time: two fit awake on a device, a third would wait
    # for one of them (busy) on every request. Two devices: a pool of two and one alone.
    requests = [*busy("a", 0, 7200, 5), *busy("b", 1, 7200, 5), *busy("c", 2, 7200, 5)]
    found = plan.search(trace.Trace.of(requests), settings())
    assert sorted(len(g) for g in found.groups) == [1, 2]
    assert found.worst == 0.0
    # It tried the pool of three, which misses the target (a point over it in the picture).
    assert any(c.worst > 2.0 for c in found.candidates)
    assert found.replays >= 2


def test_the_manifests_are_valid_and_name_each_model() -> None:
    requests = [*busy("Org/Model_1", 0, 3600), *busy("b", 3600, 7200)]
    base = plan.PlanSettings(
        device_memory=80 * GIB,
        sizes={"Org/Model_1": SIZE, "b": SIZE},
        target=2.0,
        pool=PoolFlags(min_residency=2.0),
        member=policies.parse("always-on").spec,
        latencies=Latencies(),
        measure_from=0.0,
    )
    found = plan.search(trace.Trace.of(requests), base)
    layout = plan.layout_of(found, base)
    files = manifests.build(layout.pools, [], base.member, sizes=base.sizes, bases={})
    [(name, docs)] = files.items()
    assert name == "whatif-pool-1.yaml"
    pool, *models = docs
    assert parse_pool_spec(pool["spec"]).memory_bytes == 80 * GIB
    assert pool["spec"]["minResidency"] == "2s"
    names = set()
    for doc in models:
        spec = InferenceModelSpec.model_validate(doc["spec"])
        assert spec.pool is not None and spec.pool.name == "whatif-pool-1"
        assert spec.pool.memory_bytes == 36 * GIB and spec.pool.asleep_bytes == 2 * GIB
        assert spec.idle.after == "Never"
        labels = doc["spec"]["selector"]["matchLabels"]
        assert labels == {manifests.NAME_LABEL: doc["metadata"]["name"]}
        names.add((doc["metadata"]["name"], spec.model_name))
    odd = manifests.object_name("Org/Model_1")
    assert names == {(odd, "Org/Model_1"), ("b", "b")}
    assert odd.startswith("org-model-1-") and len(odd) <= 63
    # Two names that make the same safe form still get two objects.
    assert manifests.object_name("a_b") != manifests.object_name("a.b")


def test_the_plan_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "trace.csv"
    requests = [*busy("a", 0, 3600), *busy("b", 3600, 7200), *busy("c", 0, 7200, 5)]
    path.write_text(trace.write(sorted(requests, key=lambda r: r.at)))
    mine = tmp_path / "mine.yaml"
    mine.write_text(
        "apiVersion: snooze.dev/v1alpha1\nkind: InferenceModel\n"
        "metadata: {name: model-a, namespace: team}\n"
        "spec: {modelName: a, selector: {matchLabels: {app: a}}, wake: {timeout: 5m}}\n"
    )
    out = tmp_path / "plan"
    code = main(
        ["whatif", "plan", "--trace", str(path), "--device-memory", "80Gi",
         "--model-memory", "36Gi,2Gi", "--model-memory", "c=20Gi", "--target-p99", "1s",
         "--min-residency", "2s", "--models", str(mine), "--out", str(out)]
    )  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    line = json.loads(printed.strip().splitlines()[-1])["plan"]
    assert line["devices"] == 1 and line["models"] == 3 and line["target_p99_s"] == 1.0
    assert line["result"]["devices_peak"] == 1
    assert "3 models on 1 devices" in printed
    assert (out / "plan.png").read_bytes()[:4] == b"\x89PNG"
    docs = list(yaml.safe_load_all((out / "manifests" / "whatif-pool-1.yaml").read_text()))
    assert [d["kind"] for d in docs] == ["GPUPool", "InferenceModel", "InferenceModel",
                                         "InferenceModel"]  # fmt: skip
    mine_out = next(d for d in docs if d["spec"].get("modelName") == "a")
    # Yours, with its pool: its name, namespace and other fields kept.
    assert mine_out["metadata"] == {"name": "model-a", "namespace": "team"}
    assert mine_out["spec"]["wake"] == {"timeout": "5m"}
    c = next(d for d in docs if d["metadata"]["name"] == "c")
    assert c["spec"]["pool"] == {"name": "whatif-pool-1", "memory": "20Gi", "asleepMemory": "1Gi"}


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ([], "how much memory does a take"),
        (["--model-memory", "90Gi,1Gi"], "a takes more than --device-memory 80Gi"),
        (["--model-memory", "36Gi,2Gi", "--target-p99", "soon"], "--target-p99: 'soon'"),
        (["--model-memory", "36Gi,2Gi", "--idle-after", "Auto"], "--idle-after"),
        (["--model-memory", "1Gi", "--tries", "0"], "--tries must be at least 1"),
    ],
)
def test_the_plan_command_says_what_is_wrong(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], says: str
) -> None:
    path = tmp_path / "trace.csv"
    path.write_text("timestamp,model\n0,a\n")
    args = ["whatif", "plan", "--trace", str(path), "--device-memory", "80Gi", *extra]
    assert main([*args, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1


def test_a_replay_that_must_miss_the_target_stops_early() -> None:
    # Three models busy at once on a device where two fit awake: the replay stops as soon as
    # one model has more requests held over 2 s than its 1% allows, and says a lower bound.
    requests = trace.Trace.of(
        [*busy("a", 0, 7200, 5), *busy("b", 1, 7200, 5), *busy("c", 2, 7200, 5)]
    )
    verdict = plan.replay(requests, frozenset("abc"), settings())
    assert not verdict.complete
    [(model, at_least)] = verdict.p99.items()
    assert at_least > 2.0
    # The whole replay agrees: that model's p99 is at least that.
    full = plan.verdict_of(
        frozenset("abc"),
        plan.evaluate(
            plan.member_policy(settings()),
            requests,
            latencies=Latencies(),
            measure_from=0.0,
            layout=plan.Layout(pools=[plan.pool_layout("p", "abc", settings())]),
        ),
    )
    assert full.complete and full.p99[model] >= at_least


def test_flags_before_plan_count_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # `snooze whatif --trace FILE plan ...`: what is given before the subcommand's name is not
    # undone by its defaults.
    path = tmp_path / "trace.csv"
    path.write_text(trace.write([*busy("a", 0, 600), *busy("b", 600, 1200)]))
    code = main(
        ["whatif", "--trace", str(path), "--model-memory", "36Gi,2Gi", "--min-residency", "5s",
         "plan", "--device-memory", "80Gi", "--out", str(tmp_path / "out")]
    )  # fmt: skip
    assert code == 0
    assert '"devices": 1' in capsys.readouterr().out
    [doc, *_] = yaml.safe_load_all(
        (tmp_path / "out" / "manifests" / "whatif-pool-1.yaml").read_text()
    )
    assert doc["spec"]["minResidency"] == "5s"


def test_a_plan_takes_a_bounded_number_of_models(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(plan, "MODELS_LIMIT", 2)
    path = tmp_path / "trace.csv"
    path.write_text("timestamp,model\n0,a\n1,b\n2,c\n")
    args = ["whatif", "plan", "--trace", str(path), "--device-memory", "80Gi"]
    assert main([*args, "--model-memory", "1Gi", "--out", str(tmp_path / "out")]) == 2
    assert "the trace has 3 models and a plan takes at most 2" in capsys.readouterr().err


def test_sglang_members_are_planned_with_sglangs_times(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "trace.csv"
    requests = [*busy("a", 0, 3600), *busy("b", 3600, 7200)]
    path.write_text(trace.write(sorted(requests, key=lambda r: r.at)))
    held = {}
    for kind in ("vllm", "sglang"):
        out = tmp_path / kind
        code = main(
            ["whatif", "plan", "--trace", str(path), "--device-memory", "80Gi",
             "--model-memory", "60Gi,2Gi", "--target-p99", "10s", "--min-residency", "2s",
             "--engine-kind", kind, "--out", str(out)]
        )  # fmt: skip
        assert code == 0
        line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["plan"]
        held[kind] = line["result"]["added_latency_p50_s"]
        docs = [
            d
            for f in (out / "manifests").glob("*.yaml")
            for d in yaml.safe_load_all(f.read_text())
            if d["kind"] == "InferenceModel"
        ]
        assert {d["spec"].get("engine", {}).get("kind", "vllm") for d in docs} == {kind}
    # b's first request waits for a to make room, then for its own wake: vLLM's first level-1
    # sleep (5.7 s, pinning host RAM) and wake (0.35 s); SGLang's release (1.0 s) and resume
    # (0.85 s).
    assert held == pytest.approx({"vllm": 5.7 + 0.35, "sglang": 1.0 + 0.85}, abs=1e-3)
