"""An InferenceModel's status built from what the operator saw, pure: its conditions and its account
of wake integrity."""
