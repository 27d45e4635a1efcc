"""Where an all-at-once load loses its device: the ramp before the first model call, and how
busy the device is in each third of the run.

Run: .venv/bin/python benchmarks/at_once_ramp.py [--requests 20000] [--repeat 3]
     [--base-ms 2] [--per-item-ms 0.02]
It starts a private fleet (its own redis-server, a batcher, one CPU worker serving the
synthetic model) and sends the load of ``batchfleet bench saturate``: ``submit_many`` of every
request at once on an ``AsyncProducer``, then ``results``. From the results' own timestamps
(each model call's start is its ``finished_at`` less its ``model_s``) it prints, for each run,
how long ``submit_many`` took, when the first model call started, the device's busy fraction
from the first call to the last answer and in each third of that span, and the run's
throughput. The first call waits for every input to be validated (the README's guarantee) and
for the first chunk's admission; what the device misses after it is the pipeline's.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence

from config.schema import Result
from config.settings import Settings
from producer.async_client import AsyncProducer
from workers.local.private_fleet import private_fleet
from workers.tools.bench import RESULT_TIMEOUT_S, BenchConfig
from workers.tools.bench_inputs import synthetic_input

THIRDS = 3


async def one_run(settings: Settings, count: int) -> str:
    """One load of ``count`` requests at once; its line of figures."""
    async with AsyncProducer(settings) as producer:
        sent_at = time.time()
        ids = await producer.submit_many("synthetic", [synthetic_input(n) for n in range(count)])
        submitted_s = time.time() - sent_at
        results = [result async for result in producer.results(ids, RESULT_TIMEOUT_S)]
    took_s = max(result.finished_at for result in results) - sent_at
    return describe(results, sent_at, submitted_s, took_s)


def describe(results: Sequence[Result], sent_at: float, submitted_s: float, took_s: float) -> str:
    """The run's figures: ramp, busy fractions, throughput."""
    calls = sorted(
        {(r.batch_id, r.finished_at - r.model_s, r.finished_at) for r in results},
        key=lambda call: call[1],
    )
    first, last = calls[0][1], calls[-1][2]
    span = (last - first) / THIRDS
    busy_by_third = []
    for third in range(THIRDS):
        low, high = first + third * span, first + (third + 1) * span
        busy = sum(max(0.0, min(end, high) - max(start, low)) for _, start, end in calls)
        busy_by_third.append(f"{busy / span:.0%}")
    busy_all = sum(end - start for _, start, end in calls) / (last - first)
    return (
        f"submit_many {submitted_s * 1000:6.0f} ms, first model call at "
        f"{(first - sent_at) * 1000:5.0f} ms, device busy {busy_all:.0%} "
        f"(thirds {' / '.join(busy_by_third)}), {len(results) / took_s:7.1f} req/s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--base-ms", type=float, default=2.0)
    parser.add_argument("--per-item-ms", type=float, default=0.02)
    args = parser.parse_args()
    config = BenchConfig(
        mode="saturate", requests=args.requests, base_ms=args.base_ms, per_item_ms=args.per_item_ms
    )
    print(f"{args.requests} at once, {config.describe()}, one CPU worker")
    with private_fleet({"synthetic": config.models()["synthetic"]}) as fleet:
        for _ in range(args.repeat):
            print(asyncio.run(one_run(fleet.settings, args.requests)), flush=True)


if __name__ == "__main__":
    main()
