"""Clients of inference engines: vLLM's sleep-mode HTTP contract, and the errors it can raise."""
