"""What the benchmarks send, and when: a small JSON object for the synthetic model,
English-like sentences of mixed length (most short, a long tail) for the embedding model,
and Poisson arrival times for an open loop."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

VOCABULARY = (
    "the of and to in is was for that on with as by at from his her they this have which one "
    "their were been has more when will would there other into time about only new some could "
    "these two may first then do any like my now over such our man me even most made after "
    "also did many before must through back years where much your way well down should because "
    "each just those people how too little state good very make world still own see men work "
    "long get here between both life being under never day same another know while last might "
    "us great old year off come since against go came right used take three model batch queue "
    "worker request latency throughput memory device kernel token sentence vector embedding"
)
WORDS = VOCABULARY.split()
MEDIAN_WORDS = 10
MIN_WORDS = 5
MAX_WORDS = 40


def synthetic_input(index: int) -> dict[str, int]:
    return {"n": index}


def sentence_inputs(seed: int = 1) -> Callable[[int], str]:
    """Sentences whose word counts are log-normal around ``MEDIAN_WORDS`` (``MIN_WORDS`` to
    ``MAX_WORDS``):
    the mix of short queries and long passages that makes padding costly."""
    rng = random.Random(seed)

    def sentence(_index: int) -> str:
        count = min(MAX_WORDS, max(MIN_WORDS, round(rng.lognormvariate(0, 0.6) * MEDIAN_WORDS)))
        return " ".join(rng.choices(WORDS, k=count)).capitalize() + "."

    return sentence


def inputs_for(backend: str, seed: int = 1) -> Callable[[int], Any]:
    """The input generator for ``backend``: request index -> input."""
    return sentence_inputs(seed) if backend == "embedding" else synthetic_input


async def poisson_arrivals(
    rate: float, duration_s: float, seed: int
) -> AsyncIterator[tuple[int, float]]:
    """Poisson arrivals at ``rate`` per second for ``duration_s``: yields each one's index and
    scheduled time (monotonic clock) when that time comes, so that a request is timed from
    when it was due and a late sender cannot hide queueing.

    A timer thread wakes the loop at each arrival: the loop's own timers wake up to a
    millisecond late (``epoll_wait`` takes whole milliseconds, rounded up), and a request's
    latency would count that as the fleet's."""
    rng = random.Random(seed)
    started = next_at = time.monotonic()
    schedule = []
    while next_at - started < duration_s:
        schedule.append(next_at)
        next_at += rng.expovariate(rate)
    loop = asyncio.get_running_loop()
    arrived: asyncio.Queue[int | None] = asyncio.Queue()
    stop = threading.Event()

    def tick() -> None:
        for index, due in enumerate(schedule):
            if stop.wait(max(0.0, due - time.monotonic())):
                return
            loop.call_soon_threadsafe(arrived.put_nowait, index)
        loop.call_soon_threadsafe(arrived.put_nowait, None)

    timer = threading.Thread(target=tick, name="poisson-arrivals", daemon=True)
    timer.start()
    try:
        while (index := await arrived.get()) is not None:
            yield index, schedule[index]
    finally:
        stop.set()
        timer.join()
