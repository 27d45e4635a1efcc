"""Where a request's time goes under open-loop load, from the results' own timestamps.

Run: .venv/bin/python benchmarks/latency_breakdown.py [--rate 200] [--duration 15]
Stages: scheduled arrival -> admitted, admitted -> device start, model, finished -> caller.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from workers.local.private_fleet import private_fleet
from workers.tools.bench import BenchConfig, rate_run
from workers.tools.load_stats import percentile

STAGES = ["arrival -> admitted", "admitted -> device start", "model", "finished -> caller", "total"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--duration", type=float, default=15.0)
    args = parser.parse_args()
    config = BenchConfig(mode="rate")
    with private_fleet(config.models(), pin_cores=config.pins_cores) as fleet:
        stats = asyncio.run(rate_run(fleet, config.batched_model, args.rate, args.duration))
    wall_offset = time.time() - time.monotonic()
    rows = []
    for sample in stats.ok:
        result = sample.result
        submitted = result.submitted_at or 0.0
        rows.append(
            (
                submitted - (sample.sent_at + wall_offset),
                result.finished_at - result.model_s - submitted,
                result.model_s,
                sample.answered_at + wall_offset - result.finished_at,
                sample.latency_s,
            )
        )
    for index, stage in enumerate(STAGES):
        values = [row[index] * 1000 for row in rows]
        print(
            f"{stage:<26} p50 {percentile(values, 50):7.1f}  p99 {percentile(values, 99):7.1f} ms"
        )
    summary = stats.summary()
    print(f"flush reasons {summary['flush_reasons']}, mean batch {summary['mean_batch_size']}")


if __name__ == "__main__":
    main()
