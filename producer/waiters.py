"""Who waits for which request id: the registry a producer's inbox listener delivers into.

Each ``results`` call waits on one queue of its own (``queue.SimpleQueue`` for ``Producer``,
``AsyncArrivals`` for ``AsyncProducer``, whose listener runs on the caller's loop), registered
for every id it waits for: the results of one delivery it waits for are put there as one list
(one wake-up of the waiting call a delivery, not one a result), or the error that ended the
wait; so is ``RECONNECTED`` when the listener reaches Redis again after losing it.

Ids can also be *held*: their answers will be pushed to this inbox though no call waits for
them yet (``submit`` admits its request so, on either producer). A held id's answer that arrives
before its wait is kept, a bounded number of them, for the wait that comes; a wait for a held
id needs no watch call.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections import deque
from collections.abc import Collection, Iterable, Sequence
from time import monotonic
from typing import Any, Protocol

from config.errors import BrokerUnavailable, ResultTimeout
from config.schema import Result


class Reconnected:
    """What the inbox listener puts in every waiting queue when it reaches Redis again after
    losing it: results pushed meanwhile may be lost with a dropped reply, so each waiting call
    reads its ids' stored results again."""


RECONNECTED = Reconnected()

Arrival = list[Result] | BaseException | Reconnected


class ResultQueue(Protocol):
    def put_nowait(self, item: Arrival, /) -> None: ...


# Held ids, and answers of held ids that came before their wait, kept at most: beyond them
# the oldest is forgotten, and its wait reads the stored answer with a watch call.
HELD_KEPT = 4096


# An async wait's deadline, rounded up to the next tick: the waits that end within one tick
# share one loop timer (``DeadlineTicks``), and a wait that times out ends up to a tick late.
DEADLINE_TICK_S = 0.01


class DeadlineTicks:
    """Wakes ``AsyncArrivals`` waits of one event loop at their deadlines with one loop timer
    per ``DEADLINE_TICK_S`` for every wait that ends in it. A timer of each wait's own,
    cancelled as nearly every answer comes in time, cost ~5% of the producer's CPU with 256
    callers (``benchmarks/producer_cost.py``): the loop's heap of timers, compared in Python,
    fills with cancelled ones."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ticks: dict[int, set[asyncio.Future[None]]] = {}

    def add(
        self, loop: asyncio.AbstractEventLoop, timeout_s: float, waiter: asyncio.Future[None]
    ) -> set[asyncio.Future[None]]:
        """Wakes ``waiter`` once ``timeout_s`` has passed; returns the tick's waiters, which
        ``waiter`` leaves when it no longer waits."""
        if loop is not self._loop:  # another loop's timers never wake this one's waits
            self._loop, self._ticks = loop, {}
        tick = math.ceil((loop.time() + timeout_s) / DEADLINE_TICK_S)
        waiters = self._ticks.get(tick)
        if waiters is None:
            waiters = self._ticks[tick] = set()
            loop.call_at(tick * DEADLINE_TICK_S, _expire, self._ticks, tick)
        waiters.add(waiter)
        return waiters


def _expire(ticks: dict[int, set[asyncio.Future[None]]], tick: int) -> None:
    for waiter in ticks.pop(tick):
        _wake(waiter)


class AsyncArrivals:
    """What the inbox listener puts for one ``AsyncProducer`` wait, awaited by that wait
    alone on the listener's loop: ``asyncio.Queue`` and ``asyncio.timeout`` without what one
    reader needs not (their setup was ~15% of the producer's CPU with 256 callers), its
    deadline kept by the producer's ``DeadlineTicks``."""

    def __init__(self, deadlines: DeadlineTicks) -> None:
        self._items: deque[Arrival] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._deadlines = deadlines

    def put_nowait(self, item: Arrival, /) -> None:
        self._items.append(item)
        if self._waiter is not None:
            _wake(self._waiter)

    async def get(self, timeout_s: float) -> Arrival:
        """The next item, once there is one.

        Raises:
            TimeoutError: none came within ``timeout_s`` (and up to ``DEADLINE_TICK_S``).
        """
        if not self._items:
            loop = asyncio.get_running_loop()
            self._waiter = waiter = loop.create_future()
            tick = self._deadlines.add(loop, timeout_s, waiter)
            try:
                await waiter
            finally:
                tick.discard(waiter)
                self._waiter = None
            if not self._items:
                raise TimeoutError
        return self._items.popleft()


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class Waiters:
    """The queues waiting for each request id's result, and the held ids; thread-safe."""

    def __init__(self) -> None:
        self._waiting: dict[str, list[ResultQueue]] = {}
        self._held: dict[str, bool] = {}  # insertion-ordered: the oldest is forgotten first
        self._early: dict[str, Result] = {}
        self._lock = threading.Lock()

    def add(self, request_ids: Iterable[str], queue: ResultQueue) -> set[str]:
        """Registers ``queue`` for the result of each of ``request_ids``; returns those whose
        answers need no watch call: held ones, and those that came early (put in ``queue``
        now)."""
        covered, early = set(), []
        with self._lock:
            for request_id in request_ids:
                result = self._early.pop(request_id, None)
                if result is not None:
                    early.append(result)
                    covered.add(request_id)
                    continue
                if request_id in self._held:
                    covered.add(request_id)
                self._waiting.setdefault(request_id, []).append(queue)
        if early:
            queue.put_nowait(early)
        return covered

    def hold(self, request_ids: Iterable[str]) -> None:
        """Holds ``request_ids``: their answers will be pushed here."""
        with self._lock:
            for request_id in request_ids:
                self._held[request_id] = True
            _keep_newest(self._held)

    def release(self, request_ids: Iterable[str]) -> None:
        """Stops holding ``request_ids`` (their admission did not enqueue them)."""
        with self._lock:
            for request_id in request_ids:
                self._held.pop(request_id, None)

    def remove(self, request_ids: Iterable[str], queue: ResultQueue) -> None:
        """Stops waiting with ``queue``; results that arrive later are dropped."""
        with self._lock:
            for request_id in request_ids:
                queues = self._waiting.get(request_id, [])
                if queue in queues:
                    queues.remove(queue)
                if not queues:
                    self._waiting.pop(request_id, None)

    def deliver(self, results: Iterable[Result]) -> None:
        """Puts each result in the queues waiting for it (each gets it once), those of one
        queue as one list: the waiting call wakes and takes its lock once a delivery, not
        once a result."""
        arrivals: dict[ResultQueue, list[Result]] = {}  # queues hash by identity
        with self._lock:
            for result in results:
                queues = self._waiting.pop(result.request_id, [])
                held = self._held.pop(result.request_id, False)
                if held and not queues:
                    self._early[result.request_id] = result
                for queue in queues:
                    arrivals.setdefault(queue, []).append(result)
            _keep_newest(self._early)
        for queue, arrived in arrivals.items():
            queue.put_nowait(arrived)

    def fail_all(self, error: BaseException) -> None:
        """Ends every wait with ``error`` (Redis refused the listener): each waiting queue gets
        it once."""
        with self._lock:
            waiting, self._waiting = self._waiting, {}
            self._held.clear()
        for queue in distinct_queues(waiting):
            queue.put_nowait(error)

    def reconnected(self) -> None:
        """Tells every waiting queue, once, that the listener is back (``RECONNECTED``); the
        waits stay registered. No id stays held: a push may have been lost meanwhile, so a
        wait that comes later reads the stored answer."""
        with self._lock:
            queues = distinct_queues(self._waiting)
            self._held.clear()
        for queue in queues:
            queue.put_nowait(RECONNECTED)


class InboxWaits:
    """What a producer's inbox listener offers the producer's waits, over its ``Waiters``;
    the listener (a thread per inbox for ``Producer``, a task for ``AsyncProducer``) starts
    listening on a model's inbox in ``_listen``."""

    def __init__(self) -> None:
        self._waiters = Waiters()

    def expect(self, model: str, request_ids: Iterable[str], queue: ResultQueue) -> set[str]:
        """Puts each of ``request_ids``' results (of ``model``) in ``queue`` when it arrives
        (or the error that ends the wait). Returns the ids whose answers need no watch call
        (``Waiters.add``)."""
        covered = self._waiters.add(request_ids, queue)
        self._listen(model)
        return covered

    def hold(self, model: str, request_ids: Iterable[str]) -> None:
        """Holds ``request_ids`` of ``model``, whose answers will be pushed to its inbox
        (``Waiters.hold``), and listens there."""
        self._waiters.hold(request_ids)
        self._listen(model)

    def release(self, request_ids: Iterable[str]) -> None:
        self._waiters.release(request_ids)

    def forget(self, request_ids: Iterable[str], queue: ResultQueue) -> None:
        self._waiters.remove(request_ids, queue)

    def _listen(self, model: str) -> None:
        """Starts listening on ``model``'s inbox, once."""
        raise NotImplementedError


def _keep_newest(kept: dict[str, Any]) -> None:
    """Forgets the oldest entries of ``kept`` beyond ``HELD_KEPT``."""
    while len(kept) > HELD_KEPT:
        del kept[next(iter(kept))]


def distinct_queues(waiting: dict[str, list[ResultQueue]]) -> list[ResultQueue]:
    """Each queue of ``waiting`` once."""
    return list({id(queue): queue for queues in waiting.values() for queue in queues}.values())


class ResultWait:
    """One ``results`` call, free of I/O: the ids it asked for, those it still waits for,
    their models (set once known), and its deadline (``time.monotonic``)."""

    def __init__(self, request_ids: Sequence[str], timeout_s: float) -> None:
        self.ids = list(dict.fromkeys(request_ids))
        self.waiting = set(self.ids)
        self.deadline = monotonic() + timeout_s
        self.models: dict[str, str] = {}

    def by_model(self, skipping: Collection[str] = ()) -> dict[str, list[str]]:
        """The ids still unanswered, in the order asked, by model; none of ``skipping``."""
        if skipping and self.waiting.issubset(skipping):
            return {}  # the common wait: every answer is pushed to this producer's inbox
        groups: dict[str, list[str]] = {}
        for request_id in self.still_waiting():
            if request_id not in skipping:
                groups.setdefault(self.models[request_id], []).append(request_id)
        return groups

    def left_s(self) -> float:
        return max(self.deadline - monotonic(), 0.0)

    def still_waiting(self) -> list[str]:
        """The ids still unanswered, in the order asked."""
        if len(self.waiting) == len(self.ids):
            return list(self.ids)  # none answered yet: the usual case, without a Python loop
        return [request_id for request_id in self.ids if request_id in self.waiting]

    def take(self, result: Result) -> bool:
        """Whether ``result`` answers an id still waited for (it no longer is)."""
        if result.request_id not in self.waiting:
            return False
        self.waiting.discard(result.request_id)
        return True

    def timed_out(self, outage: BrokerUnavailable | None = None) -> ResultTimeout:
        """The error that ends the wait at its deadline, naming the ids still pending."""
        pending = self.still_waiting()
        message = f"{len(pending)} of {len(self.ids)} results did not come in time"
        if outage is not None:
            message += f" (Redis could not be reached: {outage})"
        return ResultTimeout(message, pending)
