"""A process's signs of life, served as ``/livez`` and ``/readyz`` beside ``/metrics`` (the
probes of a Kubernetes pod).

Each long-running loop (a batcher per model, a worker's heartbeat) owns one ``Health``: the
loop is **live** while it turns, whatever Redis does (restarting a process cannot bring Redis
back), and **ready** while it also reaches Redis and serves.
"""

from __future__ import annotations

import time
from collections.abc import Callable

# A loop that has not turned, or not reached Redis, for this long is not live, or not ready.
STALE_AFTER_S = 30.0


class Health:
    """When one loop last turned and last reached Redis; ``time.monotonic`` by default."""

    def __init__(
        self, stale_after_s: float = STALE_AFTER_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._stale_after_s = stale_after_s
        self._clock = clock
        self._turned_at = clock()  # a new loop has its first turn's time
        self._reached_at: float | None = None

    def turned(self) -> None:
        """The loop ran a turn."""
        self._turned_at = self._clock()

    def reached(self) -> None:
        """The loop ran a turn that reached Redis and did its work."""
        self._turned_at = self._reached_at = self._clock()

    def live(self) -> bool:
        return self._clock() - self._turned_at < self._stale_after_s

    def ready(self) -> bool:
        return (
            self._reached_at is not None and self._clock() - self._reached_at < self._stale_after_s
        )
