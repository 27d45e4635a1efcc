"""The ``synthetic`` backend: a GPU-like cost model for tests, demos and benchmarks.

A batch costs ``base_ms + per_item_ms * size``, slept inside ``predict``, which the worker calls
under its process's device lock: batches run one at a time, as on one GPU, and the CPU stays
free for the pipeline. Outputs are
deterministic: for input ``x`` the output is ``{"echo": x, "length": len(json(x))}``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any


def expected_output(item: Any) -> dict[str, Any]:
    """What the synthetic model answers for ``item``; tests compare against this."""
    return {"echo": item, "length": len(json.dumps(item, sort_keys=True))}


class SyntheticModel:
    """Sleeps like a GPU batch and echoes its inputs."""

    def __init__(
        self, base_ms: float | str = 20.0, per_item_ms: float | str = 0.5, version: str = "1"
    ) -> None:
        self.version = str(version)
        self.base_ms = float(base_ms)
        self.per_item_ms = float(per_item_ms)
        if self.base_ms < 0 or self.per_item_ms < 0:
            raise ValueError("base_ms and per_item_ms must be >= 0")

    def setup(self, device: str) -> None:
        self.device = device

    def batch_seconds(self, size: int) -> float:
        return (self.base_ms + self.per_item_ms * size) / 1000.0

    def predict(self, batch: Sequence[Any]) -> list[dict[str, Any]]:
        time.sleep(self.batch_seconds(len(batch)))
        return [expected_output(item) for item in batch]
