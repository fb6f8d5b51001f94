"""Kubernetes access shared by the operator and the gateway: the API client, its credentials,
and the view of a Pod that both read."""
