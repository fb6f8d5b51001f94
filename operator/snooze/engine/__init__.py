"""Clients of inference engines: vLLM's sleep-mode HTTP contract (sleep and wake, probes), the
one HTTP session they share, and the errors they can raise."""
