"""The Celery task a batcher sends for each batch and a worker runs: its name and arguments.

JSON only (the Celery app accepts nothing else). The arguments are positional, in the order of
``BatchTask``'s fields: the model, the batch id, the batch's entries as
``[stream entry id, request id]`` pairs, and the flush reason (``size``, ``wait``,
``isolated``…, or null). The stream stays the ledger: the task only says which entries to run,
and the worker reads the requests from the stream when it claims them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

RUN_BATCH_TASK = "batchfleet.run_batch"


@dataclass(frozen=True)
class BatchTask:
    """One batch as the task carries it."""

    model: str
    batch_id: str
    entries: Sequence[Sequence[str]]
    flush_reason: str | None = None

    def args(self) -> list[Any]:
        """The task's positional arguments."""
        pairs = [[entry_id, request_id] for entry_id, request_id in self.entries]
        return [self.model, self.batch_id, pairs, self.flush_reason]

    def argsrepr(self) -> str:
        """What Flower shows of the batch: its size, never the inputs."""
        size = len(self.entries)
        return f"({self.model!r}, {self.batch_id!r}, <{size} requests>, {self.flush_reason!r})"
