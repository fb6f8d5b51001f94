"""The pure policy, the parsers and the command line, in one process."""
