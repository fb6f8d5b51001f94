"""Every decision Snooze takes, as pure functions: frozen observations, a spec and a clock in,
decisions out. No I/O and no Kubernetes, HTTP or operator framework here (import-linter keeps
it so), so that tests, property tests and simulations can drive the real thing."""
