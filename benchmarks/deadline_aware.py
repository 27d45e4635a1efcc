"""Deadline-aware batching against plain size/timeout batching, under the same load.

Both runs use the synthetic model (30 ms + 1 ms per item, one worker) with batches closed in
the batcher (no late binding): at 32 requests, or when the oldest has waited 100 ms. Requests
arrive open-loop (Poisson, the same seed for both), half with a tight deadline (80 ms), half
with a loose one (2 s). The plain policy holds a partial batch its full 100 ms; the
deadline-aware one sends it as soon as holding it longer, plus the model time measured for
its size, would miss its earliest deadline, and orders requests by deadline.

Run: .venv/bin/python benchmarks/deadline_aware.py [--rate 250] [--duration 20]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections import Counter

from producer.async_client import AsyncProducer
from workers.local.private_fleet import private_fleet
from workers.tools.bench_inputs import poisson_arrivals
from workers.tools.load_stats import percentile

POLICY = {
    "late_binding": False,
    "max_batch_size": 32,
    "max_wait_s": 0.1,
    "max_queue_len": 1_000_000,
    "options": {"base_ms": 30, "per_item_ms": 1},
}
TIGHT_S, LOOSE_S = 0.08, 2.0
WARMUP_S = 3.0


async def one(producer: AsyncProducer, model: str, deadline_s: float) -> tuple[str, float]:
    """One request: its outcome (``ok`` or the error code) and latency in ms."""
    sent = time.monotonic()
    request_id = await producer.submit(model, {"deadline_s": deadline_s}, deadline_s=deadline_s)
    async for result in producer.results([request_id], timeout_s=LOOSE_S + 10):
        outcome = "ok" if result.ok else result.error.code if result.error else "?"
        return outcome, (time.monotonic() - sent) * 1000
    raise AssertionError("no result")


async def load(producer: AsyncProducer, model: str, rate: float, duration_s: float) -> list:
    deadlines = random.Random(7)
    tasks = [
        asyncio.create_task(one(producer, model, deadlines.choice((TIGHT_S, LOOSE_S))))
        async for _ in poisson_arrivals(rate, duration_s, seed=1)
    ]
    return await asyncio.gather(*tasks)


async def measure(fleet_settings: object, model: str, rate: float, duration_s: float) -> list:
    async with AsyncProducer(fleet_settings) as producer:  # type: ignore[arg-type]
        await load(producer, model, rate, WARMUP_S)  # the workers measure model times
        return await load(producer, model, rate, duration_s)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=float, default=250.0)
    parser.add_argument("--duration", type=float, default=20.0)
    args = parser.parse_args()
    print(
        f"synthetic 30 ms + 1 ms/item, max batch 32, max wait 100 ms, no late binding; "
        f"{args.rate:g} req/s for {args.duration:g} s, half due in {TIGHT_S * 1000:g} ms, "
        f"half in {LOOSE_S:g} s"
    )
    print(f"{'policy':<16} {'sent':>6} {'expired':>8} {'share':>7} {'p50 ms':>8} {'p99 ms':>8}")
    for name, aware in (("size/timeout", False), ("deadline-aware", True)):
        models = {"synthetic": {**POLICY, "deadline_aware": aware}}
        with private_fleet(models) as fleet:
            outcomes = asyncio.run(measure(fleet.settings, "synthetic", args.rate, args.duration))
        counts = Counter(outcome for outcome, _ in outcomes)
        latencies = [latency for outcome, latency in outcomes if outcome == "ok"]
        print(
            f"{name:<16} {len(outcomes):>6} {counts['expired']:>8} "
            f"{counts['expired'] / len(outcomes):>7.1%} {percentile(latencies, 50):>8.1f} "
            f"{percentile(latencies, 99):>8.1f}"
        )


if __name__ == "__main__":
    main()
