"""The gateway: an OpenAI-compatible front door that routes by model and wakes sleeping ones.

`server` is the application and its life, `inference` one request's way through it, `model`
and `registry` what it knows of models and pods (trusting only what the operator writes),
`wake` and `hold` the wait for a wake, `proxy` the engine's answer, `body` and `connection`
the bounds on what clients send.
"""
