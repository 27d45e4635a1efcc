"""Who waits for which request id: the registry a producer's inbox listener delivers into.

The same for ``Producer`` (``concurrent.futures.Future``, a listener thread) and
``AsyncProducer`` (``asyncio.Future``, a listener task): both futures take results the same way.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Generic, Protocol, TypeVar

from config.schema import Result


class ResultFuture(Protocol):
    def done(self) -> bool: ...

    def set_result(self, result: Result, /) -> None: ...

    def set_exception(self, exception: BaseException, /) -> None: ...


F = TypeVar("F", bound=ResultFuture)


class Waiters(Generic[F]):
    """Futures by request id; thread-safe."""

    def __init__(self) -> None:
        self._waiting: dict[str, list[F]] = {}
        self._lock = threading.Lock()

    def add(self, request_id: str, future: F) -> None:
        """Registers ``future`` for ``request_id``'s result."""
        with self._lock:
            self._waiting.setdefault(request_id, []).append(future)

    def remove(self, request_id: str, future: F) -> None:
        """Stops waiting with ``future``; results that arrive later are dropped."""
        with self._lock:
            futures = self._waiting.get(request_id, [])
            if future in futures:
                futures.remove(future)
            if not futures:
                self._waiting.pop(request_id, None)

    def deliver(self, results: Iterable[Result]) -> None:
        """Resolves the futures waiting for each result."""
        for result in results:
            with self._lock:
                futures = self._waiting.pop(result.request_id, [])
            for future in futures:
                if not future.done():
                    future.set_result(result)

    def fail_all(self, error: BaseException) -> None:
        """Fails every waiting future with ``error`` (Redis went away)."""
        with self._lock:
            waiting, self._waiting = self._waiting, {}
        for futures in waiting.values():
            for future in futures:
                if not future.done():
                    future.set_exception(error)
