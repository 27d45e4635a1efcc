"""The producer side of batchfleet: submit requests and get their results by id."""

from producer.async_client import AsyncProducer
from producer.client import Producer

__all__ = ["AsyncProducer", "Producer"]
