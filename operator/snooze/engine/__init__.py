"""Clients of inference engines: vLLM's sleep-mode HTTP contract (sleep and wake, probes), the
bounded transport they queue on, and the errors they can raise."""
