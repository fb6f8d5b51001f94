"""The API types: InferenceModel and GPUPool as pydantic models, the source of the CRDs and
of spec validation, with the durations and quantities they are written in; and the facts the
parts share: what the operator and the gateway agree on, and the engine's timings."""
