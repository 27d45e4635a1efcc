"""Model time per batch size: measured by workers, read by batchers for deadline-aware batching.

A worker keeps, per model, an exponentially weighted mean of its model calls' time in
power-of-two size buckets (1, 2, 4, …) and publishes them every heartbeat in
``bf:{m:MODEL}:model_time`` (the last worker to beat wins: the fleet's devices are alike). A
batcher reads them at most every ``REFRESH_S`` and prices a batch at the mean of the smallest
bucket that holds its size, or, past the largest one measured, at that one scaled by size.
The worker also keeps a mean per exact size, which its batches waiting for the device read to
know when the running call should end (``workers.runtime.device``).
"""

from __future__ import annotations

import logging
import threading
import time

import redis

from config.keys import Keys

log = logging.getLogger(__name__)

EWMA_WEIGHT = 0.2
REFRESH_S = 2.0


def bucket_of(size: int) -> int:
    """The power of two a batch of ``size`` is measured under (1, 2, 4, 8, …)."""
    return 1 << max(0, size - 1).bit_length()


class MeasuredModelTimes:
    """A worker's running means, per model and size bucket, and per model and exact size."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._means: dict[str, dict[int, float]] = {}
        self._exact: dict[tuple[str, int], float] = {}

    def add(self, model: str, size: int, seconds: float) -> None:
        with self._lock:
            means = self._means.setdefault(model, {})
            bucket = bucket_of(size)
            means[bucket] = _moved(means.get(bucket), seconds)
            self._exact[model, size] = _moved(self._exact.get((model, size)), seconds)

    def expected_s(self, model: str, size: int) -> float | None:
        """The mean time of the model's calls of exactly ``size``; None before one ended."""
        with self._lock:
            return self._exact.get((model, size))

    def fields(self) -> dict[str, dict[str, str]]:
        """Per model, the means as a Redis hash (bucket → seconds)."""
        with self._lock:
            return {
                model: {str(bucket): f"{mean:.6f}" for bucket, mean in means.items()}
                for model, means in self._means.items()
            }


def _moved(mean: float | None, seconds: float) -> float:
    """A running mean moved towards one more call's ``seconds`` (its first, alone)."""
    return seconds if mean is None else mean + EWMA_WEIGHT * (seconds - mean)


class ModelTimeEstimate:
    """A batcher's view of one model's measured times."""

    def __init__(self, client: redis.Redis, keys: Keys, model: str) -> None:
        self._client = client
        self._key = keys.model_time(model)
        self._means: dict[int, float] = {}
        self._read_at = float("-inf")

    def seconds(self, size: int) -> float:
        """The model time a batch of ``size`` is expected to take; 0 before any is measured."""
        now = time.monotonic()
        if now - self._read_at >= REFRESH_S:
            self._read_at = now
            try:
                raw = self._client.hgetall(self._key)
            except redis.RedisError as exc:
                log.warning("model times not read: %s", exc)
            else:
                self._means = {int(bucket): float(mean) for bucket, mean in raw.items()}
        if not self._means:
            return 0.0
        bucket = bucket_of(size)
        covering = [known for known in self._means if known >= bucket]
        if covering:
            return self._means[min(covering)]
        largest = max(self._means)
        return self._means[largest] * size / largest
