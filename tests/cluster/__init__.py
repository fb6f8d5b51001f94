"""Snooze on a real Kubernetes control plane."""
