"""How the fleet's long-running processes (the worker, the batcher, the gateway) run Python's
cyclic garbage collector.

A batch's requests, decoded entries and answers are many short-lived container objects, few of
them in cycles, freed by their reference counts. With Python's defaults a young collection runs
every 700 of them still alive, and what outlives it is traversed again by the older
collections, each full one with everything imported and built at start: at batch 256 with
300,000 requests sent at once, 17% of the batcher's CPU and 14% of the worker's went to the
collector (``benchmarks/README.md``). Settled, what the process holds at start is frozen out of
every collection, and a young collection waits for 10,000 objects still alive: a batch's
working set is freed before that, so in a steady fleet the collector runs only for garbage that
builds up, cycles included.
"""

from __future__ import annotations

import gc

# Container objects allocated and still alive before a young collection runs (Python's default
# is 700): above what a batch of a few hundred requests holds at once.
YOUNG_COLLECTION_THRESHOLD = 10_000


def settle_garbage_collection() -> None:
    """Collects once, freezes what survives (imports, settings, loaded models) out of later
    collections, and raises the young collection's threshold. Call it once start-up is done,
    before the process serves: in a process that forks its pool afterwards, the children
    inherit the frozen objects untouched (their pages stay shared)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD)
