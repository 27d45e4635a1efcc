"""Producer cost: time per request of submit_many, and connections while 10,000 wait.

Run: .venv/bin/python benchmarks/producer_cost.py [--requests 10000] [--repeat 5]
Needs only a redis-server (started privately); no fleet, so nothing drains the queue.
"""

from __future__ import annotations

import argparse
import statistics
import time

import redis

from config.settings import ModelPolicy, load_settings
from producer.client import Producer
from workers.local.local_redis import LocalRedis


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    inputs = [{"text": f"sentence number {index}", "n": index} for index in range(args.requests)]
    with LocalRedis() as server:
        settings = load_settings(
            redis_url=server.url, models={"synthetic": ModelPolicy(max_queue_len=10_000_000)}
        )
        per_request_us = []
        with Producer(settings) as producer:
            for _ in range(args.repeat):
                started = time.perf_counter()
                ids = producer.submit_many("synthetic", inputs)
                per_request_us.append((time.perf_counter() - started) / len(ids) * 1e6)
            waiting = producer.results(ids, timeout_s=0.5)
            try:
                next(waiting)
            except Exception as exc:  # nothing runs the queue: the wait times out
                outcome = type(exc).__name__
            clients = redis.Redis.from_url(server.url).client_list()
    print(
        f"submit_many of {args.requests} requests, {args.repeat} runs: "
        f"median {statistics.median(per_request_us):.1f} us/request "
        f"(min {min(per_request_us):.1f}, max {max(per_request_us):.1f})"
    )
    print(
        f"waiting on {len(ids)} pending requests: {len(clients) - 1} producer connections "
        f"to Redis (the wait ended with {outcome})"
    )


if __name__ == "__main__":
    main()
