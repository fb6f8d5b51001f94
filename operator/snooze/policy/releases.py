"""What an engine's own answers can be believed to say, given its vLLM release (read in the
released wheels: docs/vllm-contract.md); pure."""

from __future__ import annotations

from snooze.policy.knownbugs import Release

SLEEP_OPERATIONS_FROM: Release = (0, 32, 0)
"""`vllm:sleep_mode_operations_in_flight{operation}`, created at the engine's first sleep or
wake, each operation's series at its own first use (serve/dev/sleep/metrics.py)."""
FULL_WAKE_RECORDED_FROM: Release = (0, 31, 0)
"""From here vLLM records the engine as awake on `vllm:engine_sleep_state` only once all of it
is (AsyncLLM.wake_up); before, after any wake, of its weights alone too."""


def sleep_running(sleeps_in_flight: int | None, release: Release | None) -> bool | None:
    """Whether the engine says a /sleep is under way: its sleep operations in flight; on a
    release that creates that gauge at the first operation, its absence means none ever
    started; None where the engine does not say (an older or unknown release)."""
    if sleeps_in_flight is not None:
        return sleeps_in_flight > 0
    if release is not None and release >= SLEEP_OPERATIONS_FROM:
        return False
    return None


def awake_gauge_believed(release: Release | None) -> bool:
    """Whether the sleep-state gauge saying `awake` can be taken at its word: an engine partly
    woken (the weights of a level-2 wake, a wake that failed at its KV cache) reads awake on a
    release before 0.31 while /is_sleeping still says true."""
    return release is not None and release >= FULL_WAKE_RECORDED_FROM
