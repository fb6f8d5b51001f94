"""The gateway's request-target check, as a table: what is refused and what passes."""

from __future__ import annotations

import pytest

from snooze.gateway.request.paths import INFERENCE_PATHS, refusal


@pytest.mark.parametrize("path", INFERENCE_PATHS)
def test_every_inference_path_passes(path: str) -> None:
    assert refusal(path) is None
    assert refusal(path + "?a=b&c=/../d") is None


@pytest.mark.parametrize(
    ("target", "why"),
    [
        ("/v1/../sleep", "'..'"),
        ("/v1/./x", "'.'"),
        ("/v1/chat/completions/..", "'..'"),
        ("/v1/%2e%2e/sleep", "percent"),
        ("/v1/chat%2Fcompletions", "percent"),
        ("/v1\\..\\sleep", "backslash"),
        ("//sleep", "empty segments"),
        ("/v1//completions", "empty segments"),
        ("http://engine/sleep", "beginning with '/'"),
        ("*", "beginning with '/'"),
        ("", "beginning with '/'"),
    ],
)
def test_second_spellings_are_refused(target: str, why: str) -> None:
    reason = refusal(target)
    assert reason is not None and why in reason


def test_a_trailing_slash_is_not_a_second_spelling() -> None:
    # Refused later by routing (404), not here: it names no other path.
    assert refusal("/v1/models/") is None
