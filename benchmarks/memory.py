"""Memory under a deep queue: peak RSS of the batcher and a worker while 100,000 requests drain.

Run: .venv/bin/python benchmarks/memory.py [--requests 100000]
Starts a private fleet (one batcher, one worker, synthetic 20 ms + 0.5 ms/item), enqueues
everything at once, samples /proc/PID/status every 0.5 s until the queue is empty.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import redis

from config.keys import Keys
from producer.client import Producer
from workers.local.private_fleet import private_fleet
from workers.tools.bench import BenchConfig


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=100_000)
    args = parser.parse_args()
    models = BenchConfig(mode="saturate").models()
    for policy in models.values():  # the backlog takes minutes to drain: nothing may expire
        policy["request_timeout_s"] = 3600
    with private_fleet(models) as fleet, Producer(fleet.settings) as producer:
        batcher, worker = fleet.processes.processes
        before = {"batcher": rss_mb(batcher.pid), "worker": rss_mb(worker.pid)}
        started = time.monotonic()
        producer.submit_many("synthetic", [{"n": index} for index in range(args.requests)])
        stream = Keys(fleet.settings.key_prefix).stream("synthetic")
        client = redis.Redis.from_url(fleet.redis_url)
        peak = dict(before)
        queued_peak = 0
        while (queued := int(client.xlen(stream))) > 0:
            queued_peak = max(queued_peak, queued)
            peak = {
                "batcher": max(peak["batcher"], rss_mb(batcher.pid)),
                "worker": max(peak["worker"], rss_mb(worker.pid)),
            }
            time.sleep(0.5)
        drained_s = time.monotonic() - started
        redis_mb = client.info("memory")["used_memory"] / 1e6
    print(
        f"{args.requests} requests queued at once (peak queue {queued_peak}), drained in "
        f"{drained_s:.1f} s ({args.requests / drained_s:.0f} req/s)"
    )
    for name in ("batcher", "worker"):
        print(f"{name}: RSS {before[name]:.0f} MB idle, peak {peak[name]:.0f} MB while draining")
    print(f"redis used_memory after drain: {redis_mb:.1f} MB")


if __name__ == "__main__":
    main()
