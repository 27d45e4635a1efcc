"""Riding out Redis trouble on the caller's side: a call that cannot reach Redis is tried
again, after growing pauses with jitter, until the caller's own deadline.

A stall, a restart or a failover takes Redis away for seconds; a caller who asked to wait
longer should not see it. ``results`` (and ``result``, ``infer``) try until their timeout,
``submit`` and ``submit_many`` for ``submit_retry_s`` per admission round trip, a stream
until its own stall rule gives up. Every call retried this way is idempotent: admission by
request id and input, a watch by re-registering the same inbox, a stream read by reading from
the last chunk seen.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialWithJitterBackoff
from redis.retry import Retry

from config.connection import broker_errors
from config.errors import BrokerUnavailable

T = TypeVar("T")

FIRST_PAUSE_S = 0.05
LONGEST_PAUSE_S = 2.0


def single_try() -> Retry:
    """redis-py's retry for a producer's clients: none, as the producer retries by deadline
    (redis-py's own ten tries would hold one call for up to ten socket timeouts)."""
    return Retry(ExponentialWithJitterBackoff(), 0)


def single_try_async() -> AsyncRetry:
    """``single_try`` for an asyncio client."""
    return AsyncRetry(ExponentialWithJitterBackoff(), 0)


class Backoff:
    """How long to pause after each failed try: exponential backoff with jitter, from 50 ms up
    to 2 s, for as long as it takes (a loop that lives as long as its producer)."""

    def __init__(self) -> None:
        self._failures = 0
        self._backoff = ExponentialWithJitterBackoff(base=FIRST_PAUSE_S, cap=LONGEST_PAUSE_S)

    def next_pause_s(self) -> float:
        self._failures += 1
        return float(self._backoff.compute(self._failures))


class Patience:
    """``Backoff`` that never pauses past ``deadline`` (``time.monotonic``)."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self._backoff = Backoff()

    def next_pause_s(self) -> float | None:
        """The pause before the next try; None once the deadline has passed."""
        left_s = self.deadline - time.monotonic()
        if left_s <= 0:
            return None
        return min(self._backoff.next_pause_s(), left_s)


def call_until(deadline: float, call: Callable[[], T]) -> T:
    """``call()``'s value, tried again while Redis cannot be reached until ``deadline``.

    Raises:
        BrokerUnavailable: Redis was still away at the deadline.
        RedisAccessDenied: as ``broker_errors``; never retried.
    """
    patience = None  # built at the first failure: most calls never need it
    while True:
        try:
            with broker_errors():
                return call()
        except BrokerUnavailable:
            patience = patience or Patience(deadline)
            pause_s = patience.next_pause_s()
            if pause_s is None:
                raise
            time.sleep(pause_s)


async def call_until_async(deadline: float, call: Callable[[], Awaitable[T]]) -> T:
    """``call_until`` for a coroutine function."""
    patience = None
    while True:
        try:
            with broker_errors():
                return await call()
        except BrokerUnavailable:
            patience = patience or Patience(deadline)
            pause_s = patience.next_pause_s()
            if pause_s is None:
                raise
            await asyncio.sleep(pause_s)
