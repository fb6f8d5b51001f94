"""One request's way through the gateway: its path allowed, its body read within bounds, a pod
picked, and the engine's answer passed on."""
