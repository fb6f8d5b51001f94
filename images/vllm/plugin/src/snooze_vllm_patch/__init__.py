"""A vLLM plugin that makes wake-up survive hybrid models with a quantized KV cache (#41564)."""

# Nothing is imported here on purpose: vLLM imports this package in every process (API
# server, engine core, workers), and torch or vLLM modules must only load where needed.

__version__ = "0.1.0"
