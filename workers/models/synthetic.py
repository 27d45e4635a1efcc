"""The ``synthetic`` backend: a GPU-like cost model for tests, demos and benchmarks.

A batch costs ``base_ms + per_item_ms * size``, slept inside ``predict``, which the worker calls
under its process's device lock: batches run one at a time, as on one GPU, and the CPU stays
free for the pipeline. Outputs are
deterministic: for input ``x`` the output is ``{"echo": x, "length": len(json(x))}``, or with
``dims`` set, an embedding-like vector of that many floats drawn from the input's SHA-256
(unit length), for the gateway's ``/v1/embeddings``.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import time
from collections.abc import Sequence
from typing import Any


def expected_output(item: Any) -> dict[str, Any]:
    """What the synthetic model answers for ``item``; tests compare against this."""
    return {"echo": item, "length": len(json.dumps(item, sort_keys=True))}


def expected_vector(item: Any, dims: int) -> list[float]:
    """What the synthetic model with ``dims`` answers for ``item``: a unit vector seeded by
    the SHA-256 of the input's JSON."""
    seed = hashlib.sha256(json.dumps(item, sort_keys=True).encode()).digest()
    draw = random.Random(seed)
    vector = [draw.gauss(0.0, 1.0) for _ in range(dims)]
    norm = math.sqrt(sum(value * value for value in vector)) or 1.0
    return [value / norm for value in vector]


class SyntheticModel:
    """Sleeps like a GPU batch and echoes its inputs."""

    def __init__(
        self,
        base_ms: float | str = 20.0,
        per_item_ms: float | str = 0.5,
        version: str = "1",
        dims: int | str = 0,
    ) -> None:
        self.version = str(version)
        self.base_ms = float(base_ms)
        self.per_item_ms = float(per_item_ms)
        self.dims = int(dims)
        if self.base_ms < 0 or self.per_item_ms < 0 or self.dims < 0:
            raise ValueError("base_ms, per_item_ms and dims must be >= 0")

    def setup(self, device: str) -> None:
        self.device = device

    def batch_seconds(self, size: int) -> float:
        return (self.base_ms + self.per_item_ms * size) / 1000.0

    def predict(self, batch: Sequence[Any]) -> list[Any]:
        time.sleep(self.batch_seconds(len(batch)))
        if self.dims:
            return [expected_vector(item, self.dims) for item in batch]
        return [expected_output(item) for item in batch]
