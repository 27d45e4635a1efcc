"""The one boundary where redis-py's exceptions become batchfleet's ``BrokerUnavailable``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import redis

from config.errors import BrokerUnavailable


@contextmanager
def broker_errors() -> Iterator[None]:
    """Re-raises Redis connection and timeout failures as ``BrokerUnavailable``."""
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise BrokerUnavailable(f"Redis is unavailable: {exc}") from exc
