"""The table of known sleep and wake bugs, and how an engine in it sleeps: tables of cases, and
properties no reading may break (an engine never sleeps at a level its row breaks, unless told
to sleep anyway)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from snooze.policy.knownbugs import (
    LEVELS,
    TABLE,
    ServeFacts,
    conduct,
    describe,
    known_bugs,
    level_limits,
    release_of,
)

LORA_TP2 = {"lora": True, "tensor_parallel": 2}


def facts(version: str | None, **args: object) -> ServeFacts:
    return ServeFacts(version=version, **args)  # type: ignore[arg-type]


def keys(found: object) -> set[str]:
    return {bug.key for bug in found}  # type: ignore[attr-defined]


def test_every_row_cites_its_vllm_issue_and_its_bounds_are_in_order() -> None:
    assert {bug.key for bug in TABLE} == {
        "lora-tp-level1",
        "lora-level2",
        "in-flight-sleep-parallel",
    }
    for bug in TABLE:
        assert "vllm#" in bug.source, bug.key
        assert bug.levels and bug.levels <= set(LEVELS)
        if bug.first is not None and bug.fixed is not None:
            assert bug.first < bug.fixed
        assert bug.lora or bug.tensor_parallel or bug.any_parallel  # a row the args can place


@pytest.mark.parametrize(
    ("version", "args", "expected"),
    [
        ("0.33.0", {}, set()),
        ("0.27.1", {"lora": True}, {"lora-level2"}),
        ("0.28.0", {"lora": True}, set()),  # fixed by PR #39935
        ("0.10.1", {"lora": True}, set()),  # no level-2 reload over HTTP before 0.10.2
        ("0.33.0", LORA_TP2, {"lora-tp-level1"}),  # no release known to carry PR #53508
        ("0.27.1", LORA_TP2, {"lora-tp-level1", "lora-level2"}),
        ("0.24.0", LORA_TP2, {"lora-tp-level1", "lora-level2", "in-flight-sleep-parallel"}),
        ("0.24.0", {"tensor_parallel": 2}, {"in-flight-sleep-parallel"}),
        ("0.24.0", {"pipeline_parallel": 4}, {"in-flight-sleep-parallel"}),
        ("0.25.0", {"tensor_parallel": 2}, set()),
        ("0.24.0", {}, set()),
        (None, {"tensor_parallel": 2}, {"in-flight-sleep-parallel"}),  # unknown: not safe
        ("0.26.1.dev5+gabc.cu129", {"lora": True}, {"lora-level2"}),
    ],
)
def test_which_rows_an_engine_is_in(
    version: str | None, args: dict[str, object], expected: set[str]
) -> None:
    assert keys(known_bugs(facts(version, **args))) == expected


@pytest.mark.parametrize(
    ("version", "args", "level", "on", "expected_level", "drained", "why"),
    [
        ("0.33.0", {}, 1, "FallBack", 1, False, ""),
        ("0.28.0", LORA_TP2, 1, "FallBack", 2, False, "sleeps at level 2 instead of 1"),
        ("0.28.0", LORA_TP2, 2, "FallBack", 2, False, "sleeps at level 2"),
        ("0.27.1", LORA_TP2, 1, "FallBack", None, False, "no sleep level is safe"),
        ("0.27.1", {"lora": True}, 2, "FallBack", 1, False, "instead of 2"),
        ("0.24.0", {"tensor_parallel": 2}, 1, "FallBack", 1, True, "once drained"),
        ("0.28.0", LORA_TP2, 1, "NeverSleep", None, False, "NeverSleep"),
        ("0.28.0", LORA_TP2, 2, "NeverSleep", 2, False, "which is safe"),
        ("0.24.0", {"tensor_parallel": 2}, 1, "NeverSleep", None, False, "NeverSleep"),
        ("0.27.1", LORA_TP2, 1, "SleepAnyway", 1, False, "anyway"),
    ],
)
def test_how_an_engine_in_the_table_sleeps(
    version: str,
    args: dict[str, object],
    level: int,
    on: str,
    expected_level: int | None,
    drained: bool,
    why: str,
) -> None:
    found = conduct(facts(version, **args), level, on)  # type: ignore[arg-type]
    assert (found.level, found.drained_only) == (expected_level, drained)
    assert why in found.why


@given(
    version=st.sampled_from(
        [None, "0.8.2", "0.10.1", "0.10.2", "0.16.0", "0.24.0", "0.27.1", "0.28.0", "0.34.0"]
    ),
    lora=st.booleans(),
    tp=st.sampled_from([1, 2, 8]),
    pp=st.sampled_from([1, 2]),
    level=st.sampled_from(LEVELS),
    on=st.sampled_from(["FallBack", "NeverSleep"]),
)
def test_an_engine_never_sleeps_at_a_level_its_rows_break(
    version: str | None, lora: bool, tp: int, pp: int, level: int, on: str
) -> None:
    engine = ServeFacts(version=version, lora=lora, tensor_parallel=tp, pipeline_parallel=pp)
    found = conduct(engine, level, on)  # type: ignore[arg-type]
    bugs = known_bugs(engine)
    if found.level is not None:
        assert not any(found.level in b.levels for b in bugs if not b.in_flight)
        assert found.level not in {limit.level for limit in level_limits(engine)}
        # A row that only a drained sleep avoids makes every sleep a drained one.
        assert found.drained_only == (on == "FallBack" and any(b.in_flight for b in bugs))
    if not bugs and not level_limits(engine):
        assert found.level == level and not found.why


def test_versions_are_read_as_their_release() -> None:
    assert release_of("0.33.0") == (0, 33, 0)
    assert release_of("v0.9") == (0, 9, 0)
    assert release_of("0.26.1rc1") == (0, 26, 1)
    assert release_of("dev") is None and release_of(None) is None


@pytest.mark.parametrize(
    ("version", "args", "on", "expected_level"),
    [
        ("0.8.2", {}, "FallBack", 1),  # /wake_up wakes everything; no reload: discarded weights
        ("0.8.3", {}, "FallBack", 1),  # tags, but no reload: every wake fails
        ("0.10.1", {}, "FallBack", 1),
        ("0.10.1", {}, "SleepAnyway", 1),  # no setting wakes from a level the release cannot
        ("0.10.1", {}, "NeverSleep", 1),  # level 1 is in no row: it is safe
        (None, {}, "FallBack", 1),  # an unknown release is not safe
        ("0.9.2", LORA_TP2, "FallBack", None),  # level 1 breaks (vllm#53888), 2 cannot wake
        ("0.10.2", {}, "FallBack", 2),
        ("0.33.0", {"tensor_parallel": 4}, "FallBack", 2),
    ],
)
def test_level_2_is_refused_where_the_release_cannot_reload_weights(
    version: str | None, args: dict[str, object], on: str, expected_level: int | None
) -> None:
    found = conduct(facts(version, **args), 2, on)  # type: ignore[arg-type]
    assert found.level == expected_level
    if expected_level == 2:
        assert not found.refused and "needs vLLM" not in found.why
    else:
        [limit] = found.refused
        assert limit.level == 2 and found.why.startswith("sleep level 2 needs vLLM 0.10.2 or later")
        told = describe(found.bugs, found.refused)
        assert "/collective_rpc" in told and "0.8.0 to 0.8.2" in told


def test_a_limit_is_said_only_where_it_changed_the_level() -> None:
    assert conduct(facts("0.9.0"), 1, "FallBack").why == ""
    assert [limit.level for limit in level_limits(facts("0.9.0"))] == [2]
    assert level_limits(facts("0.10.2")) == []


def test_a_row_is_told_with_its_source() -> None:
    told = describe(known_bugs(facts("0.27.1", lora=True)))
    assert told.startswith("lora-level2: ") and "vllm#39934" in told and "PR #39935" in told


def test_the_docs_table_has_every_row_with_its_source() -> None:
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "wake-verification.md").read_text()
    rows = [line for line in doc.splitlines() if line.startswith("| `")]
    assert len(rows) == len(TABLE)
    for bug in TABLE:
        [row] = [line for line in rows if line.startswith(f"| `{bug.key}` |")]
        issue = bug.source.split()[0]  # vllm#NNNNN
        assert issue in row, (bug.key, issue)
        level = ", ".join(str(lvl) for lvl in sorted(bug.levels))
        assert f"| {level} |" in row, (bug.key, level)


# --- SGLang ------------------------------------------------------------------------------------


def sglang(version: str | None = "0.5.23", **more: object) -> ServeFacts:
    return ServeFacts(version=version, engine="sglang", **more)  # type: ignore[arg-type]


def test_sglang_rows_are_its_own_and_cite_the_wheel_read() -> None:
    from snooze.policy.knownbugs import SGLANG_TABLE

    for bug in SGLANG_TABLE:
        assert bug.engine == "sglang" and "SGLang 0." in bug.source
        assert not bug.applies(ServeFacts(version="0.5.5", tensor_parallel=2))  # a vLLM engine
    assert not {b.key for b in TABLE} & {b.key for b in SGLANG_TABLE}


@pytest.mark.parametrize(
    ("version", "tp", "expected"),
    [
        ("0.5.5", 1, {"sglang-abort-pause-then-assert"}),
        ("0.5.6", 1, set()),
        ("0.5.23", 2, {"sglang-tp-release-answers-early"}),
        (None, 1, {"sglang-abort-pause-then-assert"}),  # an unknown release is not safe
    ],
)
def test_sglang_rows_by_release(version: str | None, tp: int, expected: set[str]) -> None:
    assert keys(known_bugs(sglang(version, tensor_parallel=tp))) == expected


@pytest.mark.parametrize(
    ("host_copy", "wanted", "level"), [(True, 2, 1), (False, 1, 2), (None, 1, None)]
)
def test_an_sglang_server_sleeps_at_the_level_its_flag_makes(
    host_copy: bool | None, wanted: int, level: int | None
) -> None:
    found = conduct(sglang(host_copy=host_copy), wanted, "FallBack")
    assert found.level == level and found.drained_only


def test_an_sglang_row_that_breaks_no_level_only_informs() -> None:
    found = conduct(sglang(tensor_parallel=4, host_copy=True), 1, "NeverSleep")
    assert found.level == 1 and keys(found.bugs) == {"sglang-tp-release-answers-early"}


@pytest.mark.parametrize(
    ("version", "saver", "metrics", "flag"),
    [
        ("0.4.8", True, True, "/pause_generation"),
        ("0.5.23", False, True, "--enable-memory-saver"),
        ("0.5.23", True, False, "--enable-metrics"),
        ("0.5.23", True, True, None),
    ],
)
def test_what_keeps_an_sglang_server_awake_names_the_fix(
    version: str, saver: bool, metrics: bool, flag: str | None
) -> None:
    from snooze.policy.knownbugs import sglang_refusal

    why = sglang_refusal(version=version, memory_saver=saver, metrics=metrics)
    assert (why is None) == (flag is None)
    if flag is not None:
        assert why is not None and flag in why
