"""Simulated SGLang servers: their HTTP contract release by release, their state, their metrics,
their application and their flags."""
