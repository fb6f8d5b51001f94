"""The gateway: an OpenAI-compatible front door that routes by model and wakes sleeping ones.

`server` is the application and its life (`cli` and `embedded` run it), then its rooms:
`request` one request's way through it (`inference`), `models` what it knows of models and
pods (trusting only what the operator writes) and the wait for a wake (`wake`, `hold`), and
`bounds` the bounds in time on clients and engines (`connection`, `clients`, `deadlines`,
`stalls`). What every room reads: `settings`, `metrics`, `errors`.
"""
