"""Pinning a worker process to one CPU core, and the cores a private fleet pins its workers to.

One interpreter runs every thread of a worker process (Celery's loop, the batch slots, the
heartbeat), and they take turns holding its GIL. On one core each turn is a switch on that
core; across cores each one wakes another core, whose thread starts with cold caches. Pinned,
a worker at a fast model's batch rate spent ~1.8 ms of CPU a batch instead of ~2.2, and its
device idled less (``benchmarks/README.md``). It suits a worker whose model computes elsewhere
(a GPU): a model that computes on the CPU with threads of its own (PyTorch on the CPU) would
have them all on that one core.
"""

from __future__ import annotations

import os

from config.errors import ConfigError


def pin_to_core(core: int) -> None:
    """Pins this process, every thread it runs now and every one it starts later, to CPU
    ``core``.

    Raises:
        ConfigError: not on Linux, or a core this process may not run on (they are named).
    """
    if not hasattr(os, "sched_setaffinity"):
        raise ConfigError(f"--core {core}: pinning a process to a core needs Linux")
    allowed = sorted(os.sched_getaffinity(0))
    if core not in allowed:
        raise ConfigError(f"--core {core}: this process may run on cores {allowed}")
    for thread in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(thread), {core})


def spare_cores(count: int) -> list[int]:
    """A core for each of ``count`` workers of a private fleet, the last cores this process may
    run on first (the first often serves the machine's interrupts), round-robin; none where
    processes cannot be pinned."""
    if not hasattr(os, "sched_getaffinity"):
        return []
    allowed = sorted(os.sched_getaffinity(0), reverse=True)
    return [allowed[index % len(allowed)] for index in range(count)]
