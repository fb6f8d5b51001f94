"""How long an engine takes to sleep, wake, reload and start, in a whatif simulation.

The defaults are the engine simulator's, from vLLM's published figures (api/enginetimes.py), and
SGLang's for a model whose spec says `engine.kind: sglang`.
The cold start, which the simulator does not model (its pods start at once), is the middle of
the published 30 to 100+ s for a full vLLM start."""

from __future__ import annotations

from dataclasses import dataclass, replace

from snooze.api import enginetimes


@dataclass(frozen=True, kw_only=True)
class Latencies:
    sleep_seconds: float = enginetimes.SLEEP_SECONDS
    """An engine's first level-1 sleep, which pins host RAM and copies the weights there (the
    engine counts as awake until it ends)."""
    pinning_share: float = enginetimes.PINNING_SHARE
    """The part of that first sleep spent pinning host RAM: later level-1 sleeps of the same
    engine reuse the pinned blocks (kept after the wake) and only copy."""
    level2_sleep_seconds: float = enginetimes.LEVEL2_SLEEP_SECONDS
    """A level-2 sleep, which discards them instead."""
    wake_seconds: float = enginetimes.WAKE_SECONDS
    """Bringing the weights back (host RAM after level 1, allocation after level 2)."""
    kv_wake_seconds: float = enginetimes.KV_WAKE_SECONDS
    """Re-allocating the KV cache on wake."""
    reload_seconds: float = enginetimes.RELOAD_SECONDS
    """Reloading the weights from disk or page cache after a level-2 sleep."""
    cold_start_seconds: float = 60.0
    """A pod scaled up from zero until its engine answers (scheduling, image, load)."""
    token_seconds: float = enginetimes.TOKEN_SECONDS
    """Per generated token: a request's service time is output_tokens times this."""
    output_tokens: int = enginetimes.DEFAULT_MAX_TOKENS
    """Tokens of a request whose trace line gives none (the simulator's max_tokens default)."""

    def for_engine(self, kind: str) -> Latencies:
        """These latencies for an engine of `kind` (spec.engine.kind): an SGLang server's
        release, resume and reload take SGLang's times (api/enginetimes.py), its pinned host
        blocks are not known to be kept between releases; the rest is the same."""
        if kind != "sglang":
            return self
        return replace(
            self,
            sleep_seconds=enginetimes.SGLANG_RELEASE_SECONDS,
            pinning_share=0.0,
            level2_sleep_seconds=enginetimes.SGLANG_DROP_SECONDS,
            wake_seconds=enginetimes.SGLANG_RESUME_SECONDS,
            reload_seconds=enginetimes.SGLANG_RELOAD_SECONDS,
        )

    def sleep(self, level: int, *, pinned: bool = False) -> float:
        """A sleep at `level`, by an engine whose process holds pinned blocks from an earlier
        level-1 sleep (`pinned`) or not."""
        if level == 2:
            return self.level2_sleep_seconds
        return self.sleep_seconds * (1 - self.pinning_share) if pinned else self.sleep_seconds

    def wake(self, level: int) -> float:
        """A whole wake from `level`: weights (and their reload after level 2), KV cache."""
        reload = self.reload_seconds if level == 2 else 0.0
        return self.wake_seconds + reload + self.kv_wake_seconds
