"""The ``batchfleet`` command: one sub-command per process or tool."""
