"""Where a fast model's device idles at saturation: each model call's start and end, read
back from the results.

Run: .venv/bin/python benchmarks/device_timeline.py [--requests 20000] [--runs 3]
Starts a private fleet (its own redis-server, a batcher, one CPU worker, pinned to a CPU core
as ``batchfleet bench`` pins it) serving the synthetic model at 2 ms + 0.02 ms per item, sends
``--requests`` at once with ``Producer.submit_many`` and collects them with ``results``, as
``pipeline_cpu.py`` does. Every result carries its
model call's end (``finished_at``) and length (``model_s``); from them it prints, per run, the
throughput, when the first call started, the calls' median length (a batch of 32 is 2.64 ms
nominal), the device's idle time between calls (in all, the median gap, the gaps of 1 ms and
3 ms or more) and that idle time in each fifth of the run.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import time
from typing import NamedTuple

from producer.client import Producer
from workers.local.local_redis import LocalRedis
from workers.local.private_fleet import private_fleet

FIFTHS = 5


class Call(NamedTuple):
    start: float
    end: float
    model_s: float
    size: int


def calls_of_run(requests: int, base_ms: float, per_item_ms: float) -> tuple[list[Call], float]:
    """The model calls of one run, in order, and when the run began (wall clock)."""
    options = {"base_ms": base_ms, "per_item_ms": per_item_ms}
    models = {
        "synthetic": {"max_batch_size": 32, "max_queue_len": requests * 2, "options": options}
    }
    with LocalRedis() as server:
        os.environ["BATCHFLEET_REDIS_URL"] = server.url
        with private_fleet(models, pin_cores=True) as fleet, Producer(fleet.settings) as producer:
            inputs = [{"n": index} for index in range(requests)]
            began = time.time()
            results = list(producer.results(producer.submit_many("synthetic", inputs)))
        del os.environ["BATCHFLEET_REDIS_URL"]
    calls = {
        result.batch_id: Call(
            start=result.finished_at - result.model_s,
            end=result.finished_at,
            model_s=result.model_s,
            size=result.batch_size,
        )
        for result in results
    }
    return sorted(calls.values()), began


def describe(calls: list[Call], began: float, requests: int) -> str:
    """One line on a run's calls: throughput, the first call, call lengths, idle time."""
    gaps = [after.start - before.end for before, after in itertools.pairwise(calls)]
    span = calls[-1].end - calls[0].start
    by_fifth = [0.0] * FIFTHS
    for before, gap in zip(calls, gaps, strict=False):  # the last call has no gap after it
        by_fifth[min(FIFTHS - 1, int((before.end - calls[0].start) / span * FIFTHS))] += gap
    largest = max(call.size for call in calls)
    full = [call.model_s for call in calls if call.size == largest]

    def ms(seconds: float) -> str:
        return f"{seconds * 1e3:.0f}"

    long_gaps = {floor: [gap for gap in gaps if gap >= floor] for floor in (1e-3, 3e-3)}
    return (
        f"{requests / (calls[-1].end - began):,.0f} req/s; first call {ms(calls[0].start - began)}"
        f" ms in; {len(calls)} calls, full ones {statistics.median(full) * 1e3:.3f} ms p50;"
        f" idle {ms(sum(gaps))} ms, gap p50 {statistics.median(gaps) * 1e3:.3f} ms,"
        f" {len(long_gaps[1e-3])} gaps >= 1 ms ({ms(sum(long_gaps[1e-3]))} ms),"
        f" {len(long_gaps[3e-3])} >= 3 ms ({ms(sum(long_gaps[3e-3]))} ms);"
        f" idle ms by fifth of the run: {' '.join(ms(idle) for idle in by_fifth)}"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--base-ms", type=float, default=2.0)
    parser.add_argument("--per-item-ms", type=float, default=0.02)
    args = parser.parse_args()
    for _ in range(args.runs):
        calls, began = calls_of_run(args.requests, args.base_ms, args.per_item_ms)
        print(describe(calls, began, args.requests), flush=True)


if __name__ == "__main__":
    main()
