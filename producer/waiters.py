"""Who waits for which request id: the registry a producer's inbox listener delivers into.

Each ``results`` call waits on one queue of its own (``queue.SimpleQueue`` for ``Producer``,
``asyncio.Queue`` for ``AsyncProducer``, whose listener runs on the caller's loop), registered
for every id it waits for: a delivered result, or the error that ended the wait, is put there.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Protocol

from config.schema import Result


class ResultQueue(Protocol):
    def put_nowait(self, item: Result | BaseException, /) -> None: ...


class Waiters:
    """The queues waiting for each request id's result; thread-safe."""

    def __init__(self) -> None:
        self._waiting: dict[str, list[ResultQueue]] = {}
        self._lock = threading.Lock()

    def add(self, request_ids: Iterable[str], queue: ResultQueue) -> None:
        """Registers ``queue`` for the result of each of ``request_ids``."""
        with self._lock:
            for request_id in request_ids:
                self._waiting.setdefault(request_id, []).append(queue)

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
        """Puts each result in the queues waiting for it (each gets it once)."""
        for result in results:
            with self._lock:
                queues = self._waiting.pop(result.request_id, [])
            for queue in queues:
                queue.put_nowait(result)

    def fail_all(self, error: BaseException) -> None:
        """Ends every wait with ``error`` (Redis went away): each waiting queue gets it once."""
        with self._lock:
            waiting, self._waiting = self._waiting, {}
        failed = {id(queue): queue for queues in waiting.values() for queue in queues}
        for queue in failed.values():
            queue.put_nowait(error)
