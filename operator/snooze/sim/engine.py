"""One simulated vLLM engine: its requests served token by token, and everything else it does
(sim/sleepmode.py: its sleep; sim/state.py: its state)."""

from __future__ import annotations

import asyncio
import random
import time

from snooze.sim import outputs
from snooze.sim.config import EngineConfig
from snooze.sim.outputs import FILLER, GARBAGE, INTACT, NONSENSE, RIGHT, WRONG, ZEROED
from snooze.sim.sleepmode import (
    HYBRID_CRASH_MESSAGE,
    SLEEP_MODES,
    SleepMode,
    WakeError,
)
from snooze.sim.state import EngineDead, EnginePaused, Request

GARBAGE_MARKER = "<garbage: weights not reloaded>"
PAUSED_MESSAGE = "Generation is paused. Please retry after it resumes."
__all__ = [
    "FILLER",
    "GARBAGE_MARKER",
    "HYBRID_CRASH_MESSAGE",
    "SLEEP_MODES",
    "EngineConfig",
    "EngineDead",
    "EnginePaused",
    "Request",
    "SimulatedEngine",
    "WakeError",
]


class SimulatedEngine(SleepMode):
    """One engine: its state (EngineState), its sleep mode (SleepMode), and its requests."""

    # --- inference -------------------------------------------------------------------------

    async def admit(self, request: Request) -> None:
        """Queue a request until the scheduler runs it: it hangs while the engine sleeps, and
        while /pause holds it (unless the release refuses new requests then)."""
        if self.reject_new:
            raise EnginePaused(PAUSED_MESSAGE)
        if self.config.nondeterministic:
            request.jitter = random.getrandbits(32) or 1
        self._requests.add(request)
        async with self._cond:
            await self._cond.wait_for(
                lambda: (
                    request.aborted
                    or (self._admitting and not self._paused and self.running < self.max_running)
                )
            )
            self._check(request)
            if request.aborted:
                return
            request.admitted = True
            request.started = time.monotonic()
            self.running += 1
            self.prompt_tokens += request.prompt_tokens

    @property
    def max_running(self) -> int:
        return self.config.max_concurrency

    def _check(self, request: Request) -> None:
        if self.dead:
            raise EngineDead(self.address)

    async def next_token(self, request: Request, index: int) -> str | None:
        """The token at `index`, or None when the request was aborted (by a sleep)."""
        if self._paused and not request.aborted:
            async with self._cond:
                await self._cond.wait_for(lambda: request.aborted or not self._paused)
        self._check(request)
        if request.aborted:
            return None
        if self.sleeping_tags:
            # Scheduled on memory sleep unmapped (a /resume while asleep, 0.17+).
            self._crash("a request ran while the engine's memory slept")
            self.kill()
            raise EngineDead(self.address)
        if self.config.token_seconds > 0:
            await asyncio.sleep(self.config.token_seconds)
            self._check(request)
            if request.aborted:
                return None
        if index == 0:
            self._observe("time_to_first_token_seconds", time.monotonic() - request.arrived)
        else:
            self._observe("inter_token_latency_seconds", self.config.token_seconds)
        self.generation_tokens += 1
        request.generated += 1
        answers = self.answers
        # A model whose greedy answers vary differs in its last token.
        jitter = request.jitter if index == request.max_tokens - 1 else 0
        request.token_ids.append(
            outputs.token_id(self.config.model, request.prompt, index, answers, jitter)
        )
        text = outputs.word(index, answers)
        if index == 0 and answers == NONSENSE:
            return f"{GARBAGE_MARKER} {text}"
        return text

    @property
    def answers(self) -> str:
        """What its answers are (outputs.RIGHT, WRONG or NONSENSE)."""
        if self.weights_state in (GARBAGE, ZEROED) or self.buffers_lost:
            return NONSENSE
        return WRONG if self.answers_off else RIGHT

    @property
    def weights_valid(self) -> bool:
        """Its weights are as loaded (not discarded by a level-2 sleep, zeroed, or restored
        wrong)."""
        return self.weights_state == INTACT

    async def finish(self, request: Request, reason: str) -> None:
        """Count a finished request and free its slot."""
        self._requests.discard(request)
        if request.admitted:
            self.running -= 1
        if not self.dead:
            self.finished[reason] = self.finished.get(reason, 0) + 1
            if reason != "abort":
                self.requests_served += 1
            if self.histograms and request.admitted:
                self._observe_finished(request)
        await self._notify()

    def _observe(self, name: str, value: float) -> None:
        if self.histograms:
            self.histograms[name].observe(value)

    def _observe_finished(self, request: Request) -> None:
        now = time.monotonic()
        queued = request.started - request.arrived
        self._observe("e2e_request_latency_seconds", now - request.arrived)
        self._observe("request_queue_time_seconds", queued)
        self._observe("request_inference_time_seconds", now - request.started)
        self._observe("request_prefill_time_seconds", 0.0)
        self._observe("request_decode_time_seconds", now - request.started)
        self._observe("request_prompt_tokens", request.prompt_tokens)
        self._observe("request_generation_tokens", request.generated)
        self._observe("request_params_max_tokens", request.max_tokens)
        self._observe("request_params_n", 1)
        self._observe("request_max_num_generation_tokens", request.max_tokens)
        self._observe("request_time_per_output_token_seconds", self.config.token_seconds)
        self._observe("request_prefill_kv_computed_tokens", request.prompt_tokens)
        self._observe("request_num_preemptions", 0)
        self._observe("iteration_tokens_total", request.prompt_tokens)
