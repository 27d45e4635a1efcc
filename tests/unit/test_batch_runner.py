"""The gateway's Batch API runner stops when the gateway closes it, whatever its loop is doing."""

from __future__ import annotations

import asyncio
from pathlib import Path

import fakeredis
import pytest

from config.keys import Keys
from config.settings import Settings
from workers.gateway.batch_runner import BatchRunner
from workers.gateway.batch_store import BatchStore
from workers.gateway.files import FileStore

# How long a close may take before it counts as never ending: a close takes milliseconds,
# and a runner that missed it scans for jobs every few seconds, forever.
CLOSE_BOUND_S = 30


def test_a_runner_woken_as_it_is_closed_still_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job created as the gateway shuts down wakes the runner in the loop turn its close
    cancels it: the runner stops all the same (on Python 3.11 the wait for that wake-up,
    an ``asyncio.wait_for``, lets the cancellation through)."""
    store = BatchStore(fakeredis.FakeRedis(), Keys("t"), lease_s=30)
    runner = BatchRunner(Settings(models={"m": {}}), store, FileStore(tmp_path, 1 << 20))

    async def scenario() -> bool:
        scanned = asyncio.Event()

        async def scan() -> None:  # the scan for free jobs, found none
            scanned.set()

        monkeypatch.setattr(runner, "_take_free_jobs", scan)
        runner.start()
        await scanned.wait()  # the runner now waits for a wake-up
        runner.wake()
        closing = asyncio.create_task(runner.aclose())
        closed, _ = await asyncio.wait([closing], timeout=CLOSE_BOUND_S)
        return closing in closed

    assert asyncio.run(scenario()), "the runner went on taking jobs after the gateway closed it"
