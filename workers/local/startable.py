"""What the tests, the demo and the benchmarks start on this machine and stop again: a start
that fails halfway stops what it had started, so nothing is left behind."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class Startable:
    """``start()`` runs ``_start()``, and ``stop()`` if that fails; usable as a ``with``
    block. Subclasses give ``_start`` and a ``stop`` that undoes any part of it."""

    def _start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def start(self) -> Self:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
