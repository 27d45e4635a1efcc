"""The fleet side of batchfleet: the batcher, the GPU-pinned Celery workers, and the CLI."""
