"""The chaos suite's model: the synthetic cost, an echo, a record of every execution, and
misbehaviour on demand.

An input is ``{"n": N}`` plus, optionally, ``"poison": "raise"`` (the model raises on any
batch holding it), ``"poison": "exit"`` (the worker process dies on it, as on a segfault) or
``"stall_s": S`` (the batch takes S seconds longer). Before running a batch the model appends
its inputs' ``n`` to ``executions_path``, one line each, in one write: the ledger counts
re-executions from that file, which outlives any process and any Redis restart.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any


class LedgerModel:
    """Echoes ``{"echo": input}`` after sleeping ``base_ms + per_item_ms * size``."""

    version = "ledger-1"

    def __init__(self, executions_path: str, base_ms: float = 20.0, per_item_ms: float = 0.5):
        self.executions_path = executions_path
        self.base_ms = float(base_ms)
        self.per_item_ms = float(per_item_ms)
        self._fd = -1

    def setup(self, device: str) -> None:
        self._fd = os.open(self.executions_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def predict(self, batch: Sequence[Any]) -> list[dict[str, Any]]:
        items = [item if isinstance(item, dict) else {} for item in batch]
        os.write(self._fd, "".join(f"{item.get('n')}\n" for item in items).encode())
        poisons = {item.get("poison") for item in items}
        if "exit" in poisons:
            os._exit(3)
        if "raise" in poisons:
            raise ValueError("poison input")
        stall_s = max((float(item.get("stall_s", 0)) for item in items), default=0.0)
        time.sleep((self.base_ms + self.per_item_ms * len(batch)) / 1000 + stall_s)
        return [{"echo": item} for item in batch]


def read_executions(path: str) -> list[str]:
    """Every execution recorded so far, as the ``n`` of its input (``None`` for others)."""
    try:
        with open(path) as file:
            return file.read().split()
    except FileNotFoundError:
        return []
