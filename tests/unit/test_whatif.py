"""`snooze whatif` against cases computed by hand: one model, known gaps, exact GPU-seconds,
wakes and holds; the trace format, the policies, the converter and the command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from snooze.cli import main
from snooze.whatif import convert, policies, report, trace
from snooze.whatif.latency import Latencies

ROOT = Path(__file__).resolve().parents[2]
LAT = Latencies()
SERVICE = 16 * 0.02  # the default output tokens, at the default pacing
WAKE_1 = 0.3 + 0.05  # weights from host RAM, then the KV cache
SLEEP = 5.7  # an engine's first level-1 sleep: it pins host RAM, then copies the weights
SLEEP_AGAIN = 5.7 * (1 - 0.86)  # its later ones reuse the pinned blocks and only copy


def simulate(policy: str, times: list[float], **kw: object) -> report.Result:
    requests = [trace.Request(at=t, model="m") for t in times]
    return report.evaluate(policies.parse(policy), requests, latencies=LAT, **kw)  # type: ignore[arg-type]


def test_fixed_ttl_by_hand() -> None:
    # 0 and 100 are answered at once; idle from 100.32, asleep at 700.32 + 5.7; the request at
    # 2000 is held through a level-1 wake (0.35 s), then answered by 2000.67.
    result = simulate("fixed:10m", [0, 100, 2000])
    awake = (100 + SERVICE + 600 + SLEEP) + (WAKE_1 + SERVICE)
    assert result.gpu_hours_awake * 3600 == pytest.approx(awake, abs=1e-3)
    assert result.wakes == 1 and result.held_requests == 1 and result.cold_starts == 0
    assert result.added_latency_p50_s == pytest.approx(WAKE_1, abs=1e-3)
    assert result.gpu_hours_always_on * 3600 == pytest.approx(2000 + SERVICE, abs=1e-3)


def test_always_on_never_sleeps() -> None:
    result = simulate("always-on", [0, 100, 2000])
    assert result.gpu_hours_awake == pytest.approx(result.gpu_hours_always_on)
    assert result.wakes == 0 and result.held_requests == 0


def test_a_short_ttl_sleeps_between_every_request() -> None:
    # Gaps of 300 s with idle.after 1m: asleep after each request, woken by the next.
    times = [0, 300, 600, 900]
    result = simulate("fixed:1m", times)
    assert result.wakes == 3 and result.held_requests == 3
    per_gap = SERVICE + 60  # awake after each request until its sleep ends
    awake = 3 * per_gap + SLEEP + 2 * SLEEP_AGAIN + 3 * WAKE_1 + SERVICE
    assert result.gpu_hours_awake * 3600 == pytest.approx(awake, abs=1e-3)


def test_level_two_wakes_reload_the_weights(tmp_path: Path) -> None:
    manifest = tmp_path / "level2.yaml"
    manifest.write_text(
        "apiVersion: snooze.dev/v1alpha1\nkind: InferenceModel\nmetadata: {name: deep}\n"
        "spec:\n  selector: {matchLabels: {app: m}}\n  idle: {after: 1m}\n  sleep: {level: 2}\n"
    )
    result = simulate(str(manifest), [0, 300])
    assert result.name == "deep"
    wake_2 = 0.3 + 20.0 + 0.05
    assert result.added_latency_p50_s == pytest.approx(wake_2, abs=1e-3)
    # A level-2 sleep copies nothing: 0.3 s, where level 1 takes 5.7 s.
    awake = (SERVICE + 60 + 0.3) + (wake_2 + SERVICE)
    assert result.gpu_hours_awake * 3600 == pytest.approx(awake, abs=1e-3)


@pytest.mark.parametrize(("level", "wake"), [(1, 0.8 + 0.05), (2, 0.8 + 20.0 + 0.05)])
def test_an_sglang_model_replays_with_sglangs_timings(
    tmp_path: Path, level: int, wake: float
) -> None:
    manifest = tmp_path / "sglang.yaml"
    manifest.write_text(
        "apiVersion: snooze.dev/v1alpha1\nkind: InferenceModel\nmetadata: {name: sg}\n"
        "spec:\n  selector: {matchLabels: {app: m}}\n  engine: {kind: sglang, port: 30000}\n"
        f"  idle: {{after: 1m}}\n  sleep: {{level: {level}}}\n"
    )
    result = simulate(str(manifest), [0, 300])
    # Resumed (the weights copied back after a release that kept them, or mapped and
    # reloaded from disk), then the KV cache.
    assert result.added_latency_p50_s == pytest.approx(wake, abs=1e-3)
    release = 1.0 if level == 1 else 0.1  # a release that copies the weights out, or drops them
    awake = (SERVICE + 60 + release) + (wake + SERVICE)
    assert result.gpu_hours_awake * 3600 == pytest.approx(awake, abs=1e-3)


def test_tiers_scale_to_zero_and_count_a_cold_start() -> None:
    # Asleep at 60.32 + 5.7; at zero replicas 120.32 after the last activity; the request at
    # 1000 is held through a 60 s cold start (the GPU counts from the scale-up).
    result = simulate("tiers:1m,2m", [0, 1000])
    assert result.cold_starts == 1 and result.wakes == 0
    assert result.added_latency_p50_s == pytest.approx(60.0, abs=1e-3)
    awake = (SERVICE + 60 + SLEEP) + (60 + SERVICE)
    assert result.gpu_hours_awake * 3600 == pytest.approx(awake, abs=1e-3)


def test_a_window_wakes_the_model_before_its_request(tmp_path: Path) -> None:
    windows = tmp_path / "windows.yaml"
    windows.write_text("- cron: '0 1 * * *'\n  duration: 30m\n")
    # 1970-01-01: requests at 00:00 and at 01:10; the window is 01:00 to 01:30 (UTC).
    fixed = simulate("fixed:10m", [0, 4200])
    scheduled = simulate(f"schedule:{windows}", [0, 4200])
    assert fixed.held_requests == 1
    assert scheduled.held_requests == 0 and scheduled.wakes == 1
    # Awake until the first sleep, then from 01:00 (the wake's start) to the trace's end, the
    # answer to 01:10.
    awake = (SERVICE + 600 + SLEEP) + (600 + SERVICE)
    assert scheduled.gpu_hours_awake * 3600 == pytest.approx(awake, abs=1e-3)


def test_prewake_learns_a_weekly_habit_and_wakes_ahead_of_it() -> None:
    week = 7 * 86400
    # A request at 09:04 every day of two weeks (after one at midnight that starts the trace
    # with the engine awake): after the first week, each is met by a pre-wake at 08:58.
    times = [0] + [day * 86400 + 9 * 3600 + 240 for day in range(14)]
    fixed = simulate("fixed:10m", times)
    ahead = simulate("prewake:2m,10m", times)
    assert fixed.held_requests == 14
    assert ahead.held_requests == 7  # the first week teaches
    measured = simulate("prewake:2m,10m", times, measure_from=float(week))
    assert measured.held_requests == 0 and measured.prewakes == 7
    assert measured.prewake_hits == 7 and measured.prewake_misses == 0
    # Awake from 08:58 to 09:04.32, then ten minutes and a sleep, each day of the second week
    # (but the last, where the trace ends with the last answer).
    per_day = 6 * 60 + SERVICE + 600 + SLEEP_AGAIN  # (its first sleep was in the first week)
    awake = 7 * per_day - (600 + SLEEP_AGAIN)
    assert measured.gpu_hours_awake * 3600 == pytest.approx(awake, abs=1e-3)


def test_a_prewake_without_its_request_is_a_miss_and_weakens_the_slot() -> None:
    day = 86400
    # Monday 1970-01-05 09:04 teaches the slot; the next Monday nothing comes (a miss); the
    # Monday after is not pre-woken, so its request is held.
    monday = 4 * day + 9 * 3600 + 240
    times = [0, monday, monday + 7 * day + 3600 * 5, monday + 14 * day]
    result = simulate("prewake:2m,10m", times)
    assert result.prewakes == 1 and result.prewake_misses == 1 and result.prewake_hits == 0
    assert result.held_requests == 3


def test_auto_chooses_a_short_keep_alive_for_bursty_traffic() -> None:
    # Bursts of 120 requests 15 s apart, every two hours for a day: 99% of the idle gaps are
    # 15 s, so Auto keeps the model awake 1m6s (the 99th percentile's minute, plus 10%) where
    # its ceiling would keep it 30 minutes; both hold the first request of each later burst.
    times = [b * 7200 + i * 15 for b in range(12) for i in range(120)]
    auto = simulate("auto:1m,30m", times)
    ceiling = simulate("fixed:30m", times)
    assert auto.held_requests == ceiling.held_requests == 11
    assert auto.gpu_hours_awake < 0.6 * ceiling.gpu_hours_awake


def test_the_trace_format() -> None:
    requests = trace.parse(
        [
            "# a comment",
            "timestamp,model,output_tokens",
            "2026-05-04T09:30:00Z,chat,100",
            "1777886910,code,",
            "2026-05-04T09:29:00,chat,7",
        ]
    ).requests()
    assert [(r.model, r.output_tokens) for r in requests] == [
        ("code", None),
        ("chat", 7),
        ("chat", 100),
    ]
    assert requests[2].at - requests[1].at == 60


@pytest.mark.parametrize(
    ("lines", "says"),
    [
        (["time,model", "1,m"], "lacks timestamp"),
        (["timestamp,model", "yesterday,m"], "line 2: 'yesterday' is neither seconds nor"),
        (["timestamp,model,output_tokens", "1,m,many"], "line 2: output_tokens 'many'"),
        (["timestamp,model", "1,"], "line 2: the model is empty"),
        (["timestamp,model"], "a header but no request"),
        ([], "empty"),
    ],
)
def test_bad_traces_are_refused_naming_the_line(lines: list[str], says: str) -> None:
    with pytest.raises(trace.TraceError, match=says):
        trace.parse(lines)


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("fixed:ten", "not a duration"),
        ("tiers:10m", "is not one of"),
        ("tiers:1h,10m", "must be longer than idle.after"),
        ("sometimes", "is not one of"),
        ("schedule:/nonexistent.yaml", "cannot read"),
    ],
)
def test_bad_policies_are_refused(spec: str, says: str) -> None:
    with pytest.raises(policies.PolicyError, match=says):
        policies.parse(spec)


def test_convert_a_prometheus_range_query() -> None:
    body = {
        "status": "success",
        "data": {
            "resultType": "matrix",
            "result": [
                {
                    "metric": {"__name__": convert.METRIC, "model": "chat", "code": "200"},
                    "values": [[1000, "5"], [1060, "8"], [1120, "8"], [1180, "2"]],
                },
                {"metric": {"model": "chat", "code": "429"}, "values": [[1000, "0"], [1060, "1"]]},
            ],
        },
    }
    requests = convert.from_prometheus(json.dumps(body))
    # 3 in the first minute (spread evenly), 1 rejected one, none, then 2 after a reset.
    assert [round(r.at) for r in requests] == [1010, 1030, 1030, 1050, 1135, 1165]
    with pytest.raises(trace.TraceError, match="resultType matrix"):
        convert.from_prometheus('{"data": {"resultType": "vector", "result": []}}')


def test_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "trace.csv"
    path.write_text("timestamp,model\n0,m\n100,m\n2000,m\n")
    code = main(
        ["whatif", "--trace", str(path), "--policy", "always-on", "--policy", "fixed:10m",
         "--out", str(tmp_path / "out")]
    )  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    last = json.loads(out.strip().splitlines()[-1])
    names = [p["name"] for p in last["policies"]]
    assert names == ["always-on", "fixed:10m"]
    # Devices held lead; the keys programs read before they were counted are all kept.
    assert list(last["policies"][0]) == [
        "name",
        "device_hours_held",
        "devices_peak",
        "gpu_hours_awake",
        "gpu_hours_always_on",
        "wakes",
        "cold_starts",
        "held_requests",
        "added_latency_p50_s",
        "added_latency_p99_s",
        "added_latency_p99_all_s",
        "swaps",
        "waits_for_room",
        "wait_for_room_p99_s",
        "unanswered",
    ]
    assert (tmp_path / "out" / "whatif.png").read_bytes()[:4] == b"\x89PNG"
    assert "fixed:10m" in out and "1 of 3" in out


def test_the_command_line_says_what_is_wrong(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # In a folder of its own: a failed run leaves no output folder behind (checked below).
    monkeypatch.chdir(tmp_path)
    assert main(["whatif", "--policy", "fixed:10m"]) == 2
    assert "give --trace FILE" in capsys.readouterr().err
    path = tmp_path / "trace.csv"
    path.write_text("timestamp,model\n0,m\n")
    assert main(["whatif", "--trace", str(path), "--policy", "fixed:soon"]) == 2
    assert "not a duration" in capsys.readouterr().err
    assert main(["whatif", "--trace", str(tmp_path / "none.csv"), "--policy", "always-on"]) == 2
    assert "cannot read the trace" in capsys.readouterr().err
    assert not (tmp_path / "snooze-whatif").exists()
    # A folder that was there before is left alone, empty or not.
    (tmp_path / "mine").mkdir()
    args = ["whatif", "--trace", str(tmp_path / "none.csv"), "--policy", "always-on"]
    assert main([*args, "--out", str(tmp_path / "mine")]) == 2
    assert (tmp_path / "mine").is_dir()


@pytest.mark.parametrize(
    ("measure_from", "says"),
    [
        ("2001", "last request is at 2000, so nothing would be counted; give a time from 0"),
        ("2030-01-01T00:00:00Z", "last request is at 2000, so nothing would be counted"),
        ("100%", "100% would count nothing"),
        ("150%", "a share is 0%"),
    ],
)
def test_a_measure_from_past_the_trace_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], measure_from: str, says: str
) -> None:
    """Counting from after the last request would print a table of zeros and exit 0, as if
    it were a result."""
    path = tmp_path / "trace.csv"
    path.write_text("timestamp,model\n0,m\n100,m\n2000,m\n")
    args = ["whatif", "--trace", str(path), "--policy", "always-on", "--out", str(tmp_path / "o")]
    assert main([*args, f"--measure-from={measure_from}"]) == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    # Its last request is still counted.
    assert main([*args, "--measure-from", "2000"]) == 0
    assert "0 of 1 requests held" in capsys.readouterr().out


def test_each_policy_gets_a_sentence_on_devices(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "trace.csv"
    # Two models, each with one request at the start and one a day later.
    path.write_text("timestamp,model\n0,a\n0,b\n86400,a\n86400,b\n")
    code = main(
        ["whatif", "--trace", str(path), "--policy", "always-on", "--policy", "fixed:10m",
         "--policy", "tiers:10m,1h", "--out", str(tmp_path / "out")]
    )  # fmt: skip
    assert code == 0
    lines = capsys.readouterr().out.splitlines()
    said = {line.split(":")[0]: line for line in lines if "devices held on average" in line}
    assert said["always-on"].startswith(
        "always-on: 2.0 devices held on average, 2 at the peak, against 2 always on: "
        "no device saved; 0 of 4 requests held."
    )
    # Sleep alone gives no device back; scale to zero does, on average and at the peak.
    assert "no device saved" in said["fixed"]
    assert "saved on average" in said["tiers"] and "requests held (p99" in said["tiers"]


def test_simulation_fields_are_all_set() -> None:
    # Guards the hand-computed cases against a simulation that silently counts nothing.
    result = simulate("fixed:1m", [0, 500])
    out = result.per_model["m"]
    assert out.requests == 2 and out.wakes == 1 and len(out.held) == 1
    assert out.engine_seconds_awake > 0 and out.engine_seconds_always_on == 500 + SERVICE


def test_an_azure_trace_becomes_a_whatif_trace(tmp_path: Path) -> None:
    # Azure's LLM inference traces (CC-BY-4.0) as their CSV files come: seven fractional digits,
    # out of order is allowed, the generated tokens become the output tokens.
    source = tmp_path / "AzureLLMInferenceTrace_code.csv"
    source.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:17:03.9799600,4808,10\n"
        "2023-11-16 18:20:07.0417510,2648,15\n"
        "2023-11-16 18:17:04.0319600,3180,8\n"
    )
    made = subprocess.run(
        [
            sys.executable,
            str(ROOT / "traces" / "make.py"),
            "--azure",
            str(source),
            "--model",
            "code",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = made.stdout.splitlines()
    assert any("CC-BY-4.0" in line for line in lines if line.startswith("#"))
    requests = trace.parse(lines).requests()
    assert [(r.model, r.output_tokens) for r in requests] == [
        ("code", 10),
        ("code", 8),
        ("code", 15),
    ]
    assert requests[0].at == pytest.approx(1700158623.980, abs=1e-3)
    assert requests[2].at - requests[0].at == pytest.approx(183.062, abs=1e-3)
    # The 183 s gap is slept through by a 1m keep-alive: one wake, one request held.
    result = report.evaluate(policies.parse("fixed:1m"), requests, latencies=LAT)
    assert result.wakes == 1 and result.held_requests == 1


def test_only_an_engines_first_level_one_sleep_pins_host_ram() -> None:
    assert LAT.sleep(1) == SLEEP
    assert LAT.sleep(1, pinned=True) == pytest.approx(SLEEP_AGAIN)
    assert LAT.sleep(2) == LAT.sleep(2, pinned=True) == 0.3
    # Sleeps at 60 s (the first), then after the scale-up at 3,000 s a new process sleeps for
    # the first time again, and after the request at 3,300 s it sleeps reusing its blocks
    # (the trace, and the count, end with the answer at 3,600 s). Against engines that pin
    # at every sleep, exactly one sleep is shorter.
    requests = [trace.Request(at=t, model="m") for t in (0, 3000, 3300, 3600)]
    tiers = policies.parse("tiers:1m,10m")
    ours = report.evaluate(tiers, requests, latencies=LAT)
    always = report.evaluate(tiers, requests, latencies=Latencies(pinning_share=0.0))
    assert ours.cold_starts == 1 and ours.wakes == 2
    saved = (always.gpu_hours_awake - ours.gpu_hours_awake) * 3600
    assert saved == pytest.approx(SLEEP - SLEEP_AGAIN, abs=1e-3)
