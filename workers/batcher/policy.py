"""The batch-forming decision, free of I/O: requests, policy, clock and capacity in; a plan out.

The policy is work-conserving: a device never idles while requests wait, and while every
device is busy requests gather into fuller batches. Rules, in order:

1. A request whose deadline has passed is dropped (it gets an ``expired`` error).
2. With no free worker slot nothing is sent: requests keep gathering into a fuller batch.
   A request taken back from a process that died holding it rides alone (``isolated``),
   so that an input that kills its process cannot take innocent requests down with it.
   Except a full batch (``size``, ``budget``): one per live worker may go beyond the slots
   (``full_ahead``). It could not grow by waiting, and queued in its worker it is there when
   the device frees, where a fast model would otherwise idle while the next batch travels.
3. With a free slot, a batch of the oldest requests leaves when ``max_batch_size`` wait
   (``size``) or the next would take it past ``max_batch_cost`` (``budget``), or when some
   worker has no batch at all (``idle``: holding would only idle its device). The oldest
   request is always in the batch; with ``group_by_cost`` the others are those of the most
   similar cost, not the next oldest (``choose``).
4. With late binding (the default) any free slot takes what is queued now (``slot``): the
   batch waits in the worker and tops itself up with newer requests when its device frees,
   so an early send costs no batch size, while holding it here would cost the dispatch
   time on the device's critical path (measured: benchmarks/README.md). Without late
   binding, a partial batch is held while every device is busy until the oldest request
   has waited ``max_wait_s`` (``wait``). A batch formed by cost cannot be topped up (the
   worker does not see costs): it is held until a device is idle (rule 3), gathering every
   request that arrives meanwhile, since a small batch waiting in a worker would cost
   throughput the padding saved.
5. A batch held to grow (rule 4) leaves early (``deadline``) when holding it longer, plus
   the model time measured for its size, would make its earliest deadline pass.
6. Otherwise the plan says how long until rule 1, 4 or 5 can next fire.

"Oldest" is by due time: a request's deadline plus its priority's handicap (0, one or two
``priority_aging_s`` for high, normal, low). With one timeout for all and no priorities that
is arrival order; with per-request deadlines it is earliest deadline first; and a low
priority request is passed only by requests due less than two aging periods after it, so it
is never starved.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

from config.schema import Request
from config.settings import ModelPolicy

FlushReason = Literal["size", "budget", "idle", "slot", "wait", "isolated", "deadline"]
# A batch sent for these reasons was full: it could not have grown by waiting.
FULL_REASONS: tuple[FlushReason, ...] = ("size", "budget")
# Time a batch needs between leaving the batcher and starting on its device.
DISPATCH_MARGIN_S = 0.005
# Full batches each live worker may hold beyond its slots (rule 2).
FULL_BATCHES_AHEAD = 1


class Pending(NamedTuple):
    """A request the batcher holds; times are on the batcher's monotonic clock (a named
    tuple: one is built per request, in a third of a frozen dataclass's time)."""

    entry_id: str
    request: Request
    arrived_at: float
    deadline_at: float
    attempts: int = 0
    cost: int = 1
    handicap_s: float = 0.0

    @property
    def due_at(self) -> float:
        """When the request is due, for ordering: its deadline plus its priority's handicap."""
        return self.deadline_at + self.handicap_s


@dataclass(frozen=True)
class Plan:
    """What to do now: expire some requests, send one batch, and how long to wait after."""

    expired: tuple[Pending, ...] = ()
    batch: tuple[Pending, ...] = ()
    flush_reason: FlushReason | None = None
    wait_s: float | None = None


def plan_batch(
    pending: Sequence[Pending],
    policy: ModelPolicy,
    now: float,
    free_slots: int,
    idle_workers: int = 0,
    model_s: Callable[[int], float] | None = None,
    full_ahead: int = 0,
) -> Plan:
    """Decides the next batch; ``wait_s`` None means nothing is due until a new event.

    Args:
        free_slots: batches the workers can take now (negative: full batches went ahead).
        idle_workers: live workers with no batch at all (their devices are idle).
        model_s: the model time measured for a batch size, for ``deadline_aware`` policies.
        full_ahead: full batches that may go beyond the free slots (rule 2).
    """
    expired = tuple(item for item in pending if item.deadline_at <= now)
    live = sorted(
        (item for item in pending if item.deadline_at > now),
        key=lambda item: (item.due_at, item.arrived_at),
    )
    if not live:
        return Plan(expired=expired)
    oldest_wait_s = now - min(item.arrived_at for item in live)
    wait_s = min(item.deadline_at for item in live) - now
    if free_slots > 0:
        suspect = next((item for item in live if item.attempts > 0), None)
        if suspect is not None:
            return Plan(expired, (suspect,), "isolated")
        batch, full = choose(live, policy)
        if full is not None:
            return Plan(expired, batch, full)
        if idle_workers > 0:
            return Plan(expired, batch, "idle")
        if policy.tops_up:
            return Plan(expired, batch, "slot")
        if not policy.batcher_chooses:
            if oldest_wait_s >= policy.max_wait_s:
                return Plan(expired, batch, "wait")
            wait_s = min(wait_s, policy.max_wait_s - oldest_wait_s)
        if policy.deadline_aware and model_s is not None:
            # Slack: how much longer the batch can wait and still finish before its earliest
            # deadline, at the model time measured for its size.
            earliest = min(item.deadline_at for item in batch)
            slack_s = earliest - now - model_s(len(batch)) - DISPATCH_MARGIN_S
            if slack_s <= 0:
                return Plan(expired, batch, "deadline")
            wait_s = min(wait_s, slack_s)
    elif free_slots + full_ahead > 0 and not any(item.attempts > 0 for item in live):
        batch, full = choose(live, policy)
        if full is not None:
            return Plan(expired, batch, full)
    return Plan(expired=expired, wait_s=max(wait_s, 0.0))


def padded_cost(batch: Sequence[Pending]) -> int:
    """What a batch costs its device: its longest input, times its size (padding)."""
    return max((item.cost for item in batch), default=0) * len(batch)


def choose(
    live: Sequence[Pending], policy: ModelPolicy
) -> tuple[tuple[Pending, ...], FlushReason | None]:
    """The next batch from ``live`` (oldest first), and ``size`` or ``budget`` when it is full.

    The oldest request is always in it, so no request waits behind more than the requests
    older than itself. The rest follow in arrival order, or with ``group_by_cost`` the ones
    whose cost is nearest the oldest's (less padding); a request that would take the batch
    past ``max_batch_cost`` is left for a later batch (TEI's rule).
    """
    anchor, rest = live[0], list(live[1:])
    if policy.group_by_cost:
        rest.sort(key=lambda item: (abs(item.cost - anchor.cost), item.arrived_at))
    batch = [anchor]
    budget = policy.max_batch_cost
    for item in rest:
        if len(batch) == policy.max_batch_size:
            return tuple(batch), "size"
        if budget is not None and padded_cost([*batch, item]) > budget:
            return tuple(batch), "budget"
        batch.append(item)
    return tuple(batch), "size" if len(batch) == policy.max_batch_size else None
