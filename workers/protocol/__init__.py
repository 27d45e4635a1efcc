"""The Redis protocol the batcher and the worker runtime share: one writes, the other reads."""
