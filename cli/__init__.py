"""The command line: the only layer that may import both server and client."""
