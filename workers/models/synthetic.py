"""The ``synthetic`` backend: a GPU-like cost model for tests, demos and benchmarks.

A batch costs ``base_ms + per_item_ms * size``, slept inside ``predict``, which the worker calls
under its process's device lock: batches run one at a time, as on one GPU, and the CPU stays
free for the pipeline. With ``launch_ms`` the batch is also launched from Python first, as
eager PyTorch launches its kernels: that much of the calling thread's CPU time, holding the
GIL but for a moment every ``LAUNCH_STEP_S`` (a kernel launch), while the device time runs
from the first launch; a MiniLM batch of 32 on an H200 is ~10 ms of launches for under 1 ms
of GPU work (``benchmarks/README.md``). Outputs are
deterministic: for input ``x`` the output is ``{"echo": x, "length": len(json(x))}``, or with
``dims`` set, an embedding-like vector of that many floats drawn from the input's SHA-256
(unit length), for the gateway's ``/v1/embeddings``. They are built in ``postprocess``,
after the device is free, as a GPU model's CPU-side conversions would be.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import time
from collections.abc import Sequence
from typing import Any

LAUNCH_STEP_S = 30e-6  # Python between two kernel launches in eager PyTorch, about
# A launch's own work, done with the GIL let go (hashlib lets it go past 2 KiB): ~18 µs here,
# long enough for a thread waiting for the GIL to take it, as it does from PyTorch (~10 µs
# of it was not, on this project's 2-core machine).
LAUNCH_WORK = bytes(32 * 1024)


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
        launch_ms: float | str = 0.0,
    ) -> None:
        self.version = str(version)
        self.base_ms = float(base_ms)
        self.per_item_ms = float(per_item_ms)
        self.dims = int(dims)
        self.launch_ms = float(launch_ms)
        if min(self.base_ms, self.per_item_ms, self.dims, self.launch_ms) < 0:
            raise ValueError("base_ms, per_item_ms, dims and launch_ms must be >= 0")

    def setup(self, device: str) -> None:
        self.device = device

    def batch_seconds(self, size: int) -> float:
        return (self.base_ms + self.per_item_ms * size) / 1000.0

    def predict(self, batch: Sequence[Any]) -> list[Any]:
        """The batch's device time; what the device computed is the inputs themselves, which
        ``postprocess`` turns into the outputs."""
        started = time.perf_counter()
        if self.launch_ms:
            launch(self.launch_ms / 1000.0)
        time.sleep(max(0.0, self.batch_seconds(len(batch)) - (time.perf_counter() - started)))
        return list(batch)

    def postprocess(self, computed: Sequence[Any]) -> list[Any]:
        if self.dims:
            return [expected_vector(item, self.dims) for item in computed]
        return [expected_output(item) for item in computed]


def launch(cpu_seconds: float) -> None:
    """Runs Python for ``cpu_seconds`` of this thread's CPU time, a launch (``LAUNCH_WORK``,
    without the GIL) every ``LAUNCH_STEP_S`` of it. CPU time, not wall time: a thread kept
    waiting for the GIL makes no progress, as a launching thread does not."""
    end = time.thread_time() + cpu_seconds
    while (now := time.thread_time()) < end:
        step_end = min(end, now + LAUNCH_STEP_S)
        while time.thread_time() < step_end:
            pass
        hashlib.sha256(LAUNCH_WORK)
