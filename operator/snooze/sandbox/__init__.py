"""A Kubernetes API server in a process: kmock's emulator, faithful enough for kopf and kubectl."""

from snooze.sandbox.runner import Sandbox, kubeconfig

__all__ = ["Sandbox", "kubeconfig"]
