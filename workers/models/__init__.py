"""Model backends that a worker runs: the protocol, the registry, and the built-ins."""
