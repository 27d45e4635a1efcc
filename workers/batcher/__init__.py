"""The batcher process: drains each request stream into micro-batches, one Celery task each."""
