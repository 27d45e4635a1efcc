"""Calls that many coroutines make on one event-loop turn, sent to Redis together.

Two hundred callers that each ``await producer.submit(...)`` wake on the same turn; sent one
by one, each pays a round trip and a script call of its own. A ``TurnBatch`` gathers what
its callers ask on one turn, sends it at the start of the next in one ``send`` call, and
hands each caller its own outcome: a value, or the exception that is that caller's alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

Send = Callable[[list[T]], Awaitable[Sequence[R | BaseException]]]


class TurnBatch(Generic[T, R]):
    """Gathers items asked for on one loop turn into one ``send``; ``send`` returns one
    outcome per item, in order, and an exception it raises is every caller's."""

    def __init__(self, send: Send[T, R]) -> None:
        self._send = send
        self._gathered: list[tuple[T, asyncio.Future[R]]] = []
        self._sending: set[asyncio.Task[None]] = set()

    async def __call__(self, item: T) -> R:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        self._gathered.append((item, future))
        if len(self._gathered) == 1:
            loop.call_soon(self._start_sending)
        return await future

    def _start_sending(self) -> None:
        gathered, self._gathered = self._gathered, []
        task = asyncio.create_task(self._deliver(gathered))
        self._sending.add(task)  # held until done: the loop keeps only weak references
        task.add_done_callback(self._sending.discard)

    async def _deliver(self, gathered: list[tuple[T, asyncio.Future[R]]]) -> None:
        try:
            outcomes = await self._send([item for item, _ in gathered])
        except asyncio.CancelledError:
            for _, future in gathered:
                future.cancel()
            raise
        except Exception as exc:  # every caller's
            for _, future in gathered:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), outcome in zip(gathered, outcomes, strict=True):
            if future.done():  # its caller was cancelled meanwhile
                continue
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)
