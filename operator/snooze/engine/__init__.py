"""Clients of inference engines: vLLM's sleep-mode HTTP contract (sleep and wake, probes), the
HTTP client code they share (engine/http.py), and the errors they can raise."""
