"""Snooze: put idle vLLM models to sleep and wake them on demand."""

__version__ = "0.1.0"
