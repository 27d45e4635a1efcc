"""The open-loop benchmark's arrival times (``poisson_arrivals``)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time

from workers.tools.bench_inputs import poisson_arrivals


def test_arrivals_come_in_order_and_never_before_they_are_due() -> None:
    """Each arrival is handed over once its scheduled time has come, with that time: a request
    is timed from when it was due."""

    async def collect() -> list[tuple[int, float, float]]:
        return [
            (index, due, time.monotonic())
            async for index, due in poisson_arrivals(rate=2000, duration_s=0.2, seed=3)
        ]

    seen = asyncio.run(collect())
    assert seen, "no arrival in 0.2 s at 2,000 per second"
    assert [index for index, _, _ in seen] == list(range(len(seen)))
    assert all(earlier[1] < later[1] for earlier, later in itertools.pairwise(seen))
    assert all(handed_at >= due for _, due, handed_at in seen)


def test_leaving_the_arrivals_early_stops_their_timer() -> None:
    """A load that stops after a few arrivals leaves no timer thread waiting out the rest."""

    async def first_three() -> None:
        async with contextlib.aclosing(poisson_arrivals(1000, 60, seed=1)) as arrivals:
            async for index, _ in arrivals:
                if index == 2:
                    break

    asyncio.run(first_three())
    assert not [thread for thread in threading.enumerate() if thread.name == "poisson-arrivals"]
