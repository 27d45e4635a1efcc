"""The GPU-pinned Celery worker process: one device, models loaded once, batches answered."""
