"""The gateway's bounds in time: on a client connection's head, on clients that stop reading,
on an engine's first byte and silences, and on engines that take requests and start none."""
