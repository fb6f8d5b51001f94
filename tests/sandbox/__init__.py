"""The Kubernetes API emulator, held to kubectl."""
