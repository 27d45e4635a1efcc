"""What a worker process has run since it started, for its node status."""

from __future__ import annotations

import threading

from config import node_status


class WorkDone:
    """Model calls, requests and device time so far, in all and per model; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.batches = self.requests = 0
        self.busy_s = 0.0
        self.last_batch_at: float | None = None
        self._per_model: dict[str, list[int]] = {}

    def add(self, model: str, requests: int, model_s: float, finished_at: float) -> None:
        with self._lock:
            self.batches += 1
            self.requests += requests
            self.busy_s += model_s
            self.last_batch_at = finished_at
            counts = self._per_model.setdefault(model, [0, 0])
            counts[0] += 1
            counts[1] += requests

    def fields(self) -> dict[str, str]:
        """The node status fields it owns: the counters, per model too, and the last call."""
        with self._lock:
            done = {
                node_status.BATCHES: str(self.batches),
                node_status.REQUESTS: str(self.requests),
                node_status.BUSY_S: f"{self.busy_s:.6f}",
            }
            for model, (batches, requests) in self._per_model.items():
                done[node_status.batches_of(model)] = str(batches)
                done[node_status.requests_of(model)] = str(requests)
            if self.last_batch_at is not None:
                done[node_status.LAST_BATCH_AT] = f"{self.last_batch_at:.3f}"
            return done
