"""The latency the model alone allows under ``bench rate``'s load: the floor under any pipeline.

Run: .venv/bin/python benchmarks/latency_floor.py [--rate 200] [--requests 200000]
Simulates ``batchfleet bench rate``'s open-loop Poisson arrivals against one device running
the synthetic model (``base_ms + per_item_ms`` a request, batches of up to
``max_batch_size``), with nothing between them: a request joins the first call that starts
after it arrives, and a call starts the moment the device frees with whatever has arrived,
or with the next arrival on an idle device. It prints that floor's p50 and p99, then again
with the fixed costs a pipeline adds to every request (``--admit-ms``, ``--cutoff-ms``,
``--gap-ms``, ``--deliver-ms``: admission, how long before a call starts a request must have
arrived to join it, the device's idle time between calls, and the answer's way back), so
that a measured p50 / p99 can be read against the costs that explain it.
"""

from __future__ import annotations

import argparse
import random

from workers.tools.bench import BenchConfig
from workers.tools.load_stats import percentile


def simulate(
    config: BenchConfig,
    rate: float,
    requests: int,
    admit_s: float = 0.0,
    cutoff_s: float = 0.0,
    gap_s: float = 0.0,
    deliver_s: float = 0.0,
) -> tuple[float, float]:
    """p50 and p99 latency in ms, from each request's arrival to its answer."""
    draw = random.Random(config.seed)
    arrivals, now = [], 0.0
    for _ in range(requests):
        now += draw.expovariate(rate)
        arrivals.append(now)
    latencies: list[float] = []
    first, device_free = 0, 0.0
    while first < requests:
        start = max(device_free, arrivals[first] + admit_s + cutoff_s)
        last = first
        while (
            last < requests
            and last - first < config.max_batch_size
            and arrivals[last] + admit_s + cutoff_s <= start
        ):
            last += 1
        end = start + (config.base_ms + config.per_item_ms * (last - first)) / 1000
        latencies += [(end + deliver_s - arrivals[n]) * 1000 for n in range(first, last)]
        device_free, first = end + gap_s, last
    return percentile(latencies, 50), percentile(latencies, 99)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--admit-ms", type=float, default=0.0)
    parser.add_argument("--cutoff-ms", type=float, default=0.0)
    parser.add_argument("--gap-ms", type=float, default=0.0)
    parser.add_argument("--deliver-ms", type=float, default=0.0)
    args = parser.parse_args()
    config = BenchConfig(mode="rate")
    print(
        f"{args.rate:g} req/s, synthetic model {config.base_ms:g} ms + {config.per_item_ms:g}"
        f" ms/item, max batch {config.max_batch_size}, {args.requests} requests simulated"
    )
    p50, p99 = simulate(config, args.rate, args.requests)
    print(f"the model alone:        p50 {p50:5.1f}  p99 {p99:5.1f} ms")
    costs = [args.admit_ms, args.cutoff_ms, args.gap_ms, args.deliver_ms]
    p50, p99 = simulate(config, args.rate, args.requests, *(cost / 1000 for cost in costs))
    print(
        f"with the pipeline's costs (admit {args.admit_ms:g}, cutoff {args.cutoff_ms:g},"
        f" gap {args.gap_ms:g}, deliver {args.deliver_ms:g} ms): p50 {p50:5.1f}  p99 {p99:5.1f} ms"
    )


if __name__ == "__main__":
    main()
