"""The batch-forming decision, free of I/O: requests, policy, clock and free slots in; a plan out.

Rules, in order:

1. A request whose deadline has passed is dropped (it gets an ``expired`` error).
2. With no free worker slot nothing is sent: requests keep gathering into a fuller batch.
3. With a free slot, a batch leaves when ``max_batch_size`` requests wait (``size``), or when
   the oldest has waited ``max_wait_s`` since it arrived (``wait``), oldest first.
4. Otherwise the plan says how long until rule 1 or 3 can next fire.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from config.schema import Request
from config.settings import ModelPolicy

FlushReason = Literal["size", "wait"]


@dataclass(frozen=True)
class Pending:
    """A request the batcher holds; times are on the batcher's monotonic clock."""

    entry_id: str
    request: Request
    raw: str
    arrived_at: float
    deadline_at: float


@dataclass(frozen=True)
class Plan:
    """What to do now: expire some requests, send one batch, and how long to wait after."""

    expired: tuple[Pending, ...] = ()
    batch: tuple[Pending, ...] = ()
    flush_reason: FlushReason | None = None
    wait_s: float | None = None


def plan_batch(
    pending: Sequence[Pending], policy: ModelPolicy, now: float, free_slots: int
) -> Plan:
    """Decides the next batch; ``wait_s`` None means nothing is due until a new event."""
    expired = tuple(item for item in pending if item.deadline_at <= now)
    live = sorted(
        (item for item in pending if item.deadline_at > now), key=lambda item: item.arrived_at
    )
    if not live:
        return Plan(expired=expired)
    oldest_wait_s = now - live[0].arrived_at
    if free_slots > 0:
        if len(live) >= policy.max_batch_size:
            return Plan(expired, tuple(live[: policy.max_batch_size]), "size")
        if oldest_wait_s >= policy.max_wait_s:
            return Plan(expired, tuple(live), "wait")
    until_deadline_s = min(item.deadline_at for item in live) - now
    wait_s = until_deadline_s
    if free_slots > 0:
        wait_s = min(wait_s, policy.max_wait_s - oldest_wait_s)
    return Plan(expired=expired, wait_s=max(wait_s, 0.0))
