"""How long a vLLM engine takes to sleep, wake and generate, by vLLM's published figures
(docs/vllm-contract.md): the defaults of the engine simulator and of whatif's replay alike, said
once so that the two cannot drift apart."""

from __future__ import annotations

SLEEP_SECONDS = 5.7
"""An engine's first level-1 sleep: it pins host RAM for the weights' copy, then copies them
(the engine counts as awake until it ends)."""
PINNING_SHARE = 0.86
"""The part of that first sleep spent pinning host RAM, which later level-1 sleeps of the same
process skip: PyTorch's caching host allocator keeps the pinned blocks after the wake, and the
next sleep reuses them (vLLM PR #58066: the first level-1 sleep "can spend most of its time
allocating pinned host buffers"). 0.86: a 16 GiB copy at about 20 GiB/s, 0.8 s of the 5.7 s."""
LEVEL2_SLEEP_SECONDS = 0.3
"""A level-2 sleep: it copies nothing, only unmaps (vLLM's allocator offloads the `weights` tag
at level 1 alone), so it is much faster; level 0 only pauses, at once."""
WAKE_SECONDS = 0.3
"""Bringing the weights back (from host RAM after level 1, allocation after level 2)."""
KV_WAKE_SECONDS = 0.05
"""Re-allocating the KV cache on wake."""
RELOAD_SECONDS = 20.0
"""Reloading the weights from disk or page cache after a level-2 sleep (`collective_rpc
reload_weights`)."""
TOKEN_SECONDS = 0.02
"""Pacing between generated tokens."""
DEFAULT_MAX_TOKENS = 16
"""Tokens generated for a request that gives no `max_tokens` (finish reason `stop`)."""

# SGLang's release and resume (torch_memory_saver: CUDA virtual memory unmapped and mapped again
# at the same addresses). No figure is published for a whole server: these are the bytes each
# step moves at a PCIe host copy's 20 GiB/s, for the 16 GiB of weights the simulator holds.
SGLANG_RELEASE_SECONDS = 1.0
"""A release that copies the weights to host RAM first (--enable-weights-cpu-backup)."""
SGLANG_DROP_SECONDS = 0.1
"""A release that drops them: only the unmapping."""
SGLANG_RESUME_SECONDS = 0.8
"""Mapping the weights again (and copying them back, when a host copy was kept)."""
SGLANG_RELOAD_SECONDS = RELOAD_SECONDS
"""/update_weights_from_disk after a release without a host copy: a load from disk or page
cache, as vLLM's reload."""
