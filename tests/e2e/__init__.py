"""Real processes (operator, gateway, simulated engines, Prometheus) against the sandbox."""
