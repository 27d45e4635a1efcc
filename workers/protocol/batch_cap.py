"""The batch size a model's devices can hold, learned from out-of-memory errors and shared
through Redis: a worker that runs out of memory at size N lowers the cap to N/2 for every
worker and batcher of the model; after ``RAISE_AFTER`` batches in a row at the cap without
one, it raises the cap by an eighth, until it is back at ``max_batch_size`` and forgotten."""

from __future__ import annotations

import logging
import threading
import time

import redis

from config import lua
from config.keys import Keys

log = logging.getLogger(__name__)
RAISE_AFTER = 20
REFRESH_S = 1.0


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` says the device ran out of memory (torch's OutOfMemoryError, or a CUDA
    / allocator message saying so)."""
    return type(exc).__name__ == "OutOfMemoryError" or "out of memory" in str(exc).lower()


class BatchCap:
    """One model's cap, as a worker sees and moves it."""

    def __init__(self, client: redis.Redis, keys: Keys, model: str, max_batch_size: int) -> None:
        self._client = client
        self._key = keys.batch_cap(model)
        self._model = model
        self._max = max_batch_size
        self._lower = lua.register(client, "lower_batch_cap")
        self._raise = lua.register(client, "raise_batch_cap")
        self._lock = threading.Lock()
        self._at_cap = 0
        self._cap = max_batch_size
        self._read_at = float("-inf")

    def current(self) -> int:
        """The cap (``max_batch_size`` when none is set), read from Redis at most once every
        ``REFRESH_S``: a batch path pays no round trip for it. Redis being away keeps the last
        value read."""
        now = time.monotonic()
        if now - self._read_at >= REFRESH_S:
            self._read_at = now
            try:
                value = self._client.get(self._key)
            except redis.RedisError as exc:
                log.warning("model %s: batch cap not read: %s", self._model, exc)
                return self._cap
            self._cap = min(self._max, int(value)) if value else self._max
        return self._cap

    def out_of_memory(self, size: int) -> None:
        """A batch of ``size`` (more than one input) ran out of memory: the cap drops to half
        of it. One input too big for the device says nothing about batches: no change."""
        if size < 2:
            return
        try:
            cap = int(self._lower(keys=[self._key], args=[size // 2]))
        except redis.RedisError as exc:
            log.warning("model %s: batch cap not lowered: %s", self._model, exc)
            cap = min(self._cap, size // 2)
        with self._lock:
            self._at_cap = 0
            self._cap, self._read_at = cap, time.monotonic()
        log.warning(
            "model %s ran out of memory at batch %d: batches capped at %d", self._model, size, cap
        )

    def succeeded(self, size: int) -> None:
        """A batch of ``size`` ran; enough of them in a row at the cap raise it."""
        current = self.current()
        if current >= self._max or size < current:
            return
        with self._lock:
            self._at_cap += 1
            if self._at_cap < RAISE_AFTER:
                return
            self._at_cap = 0
        cap = current + max(1, current // 8)
        try:
            raised = self._raise(keys=[self._key], args=[current, "" if cap >= self._max else cap])
        except redis.RedisError as exc:
            log.warning("model %s: batch cap not raised: %s", self._model, exc)
            return
        if raised:
            with self._lock:
                self._cap, self._read_at = min(cap, self._max), time.monotonic()
            log.info("model %s: batch cap raised to %d", self._model, min(cap, self._max))
