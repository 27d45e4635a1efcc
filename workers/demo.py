"""``batchfleet demo``: a private fleet, 2,000 requests batched, then the same load unbatched."""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from config.errors import BatchfleetError
from config.schema import Result
from config.settings import load_settings
from producer.client import Producer
from workers.local_fleet import LocalFleet
from workers.local_redis import LocalRedis

BATCHED = "synthetic"
ONE_AT_A_TIME = "synthetic-unbatched"
DEMO_MODELS: dict[str, dict[str, Any]] = {BATCHED: {}, ONE_AT_A_TIME: {"max_batch_size": 1}}
READY_TIMEOUT_S = 60.0


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile (0 < q <= 100) of ``values``."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True)
class RunReport:
    """What one load run achieved."""

    sent: int
    completed: int
    errored: int
    seconds: float
    latencies_s: list[float]
    batch_sizes: list[int]

    @property
    def throughput(self) -> float:
        return self.completed / self.seconds if self.seconds > 0 else 0.0

    def line(self, label: str) -> str:
        p50 = percentile(self.latencies_s, 50) * 1000 if self.latencies_s else float("nan")
        p99 = percentile(self.latencies_s, 99) * 1000 if self.latencies_s else float("nan")
        mean_batch = sum(self.batch_sizes) / len(self.batch_sizes) if self.batch_sizes else 0.0
        return (
            f"{label:<16} {self.completed:>5}/{self.sent:<5} {self.errored:>6} "
            f"{self.throughput:>9.1f} {p50:>8.1f} {p99:>8.1f} {mean_batch:>10.1f}"
        )


def collect(sent: int, results: Iterator[Result], started: float) -> RunReport:
    """Tallies results as they arrive; latency is from submit to arrival here."""
    completed = errored = 0
    latencies: list[float] = []
    batches: dict[str, int] = {}
    for result in results:
        arrived = time.time()
        if result.ok:
            completed += 1
            latencies.append(arrived - (result.submitted_at or arrived))
            if result.batch_id:
                batches[result.batch_id] = result.batch_size
        else:
            errored += 1
    return RunReport(
        sent, completed, errored, time.monotonic() - started, latencies, list(batches.values())
    )


def load_run(producer: Producer, model: str, count: int) -> RunReport:
    """Sends ``count`` requests to ``model`` at once and gathers every answer."""
    started = time.monotonic()
    ids = producer.submit_many(model, [{"n": index} for index in range(count)])
    timeout_s = max(120.0, count * 0.1)
    return collect(count, producer.results(ids, timeout_s=timeout_s), started)


@contextlib.contextmanager
def redis_for_demo() -> Iterator[str]:
    """The user's Redis when BATCHFLEET_REDIS_URL is set, else a private one."""
    url = os.environ.get("BATCHFLEET_REDIS_URL")
    if url:
        yield url
        return
    with LocalRedis() as server:
        yield server.url


def run_demo(requests: int = 2000, baseline: int = 2000) -> int:
    """Runs the demo and prints its report; 0 when every request completed."""
    prefix = f"demo-{uuid.uuid4().hex[:8]}"
    with redis_for_demo() as url:
        env = {
            "BATCHFLEET_REDIS_URL": url,
            "BATCHFLEET_KEY_PREFIX": prefix,
            "BATCHFLEET_MODELS": json.dumps(DEMO_MODELS),
        }
        settings = load_settings(redis_url=url, key_prefix=prefix, models=DEMO_MODELS)
        print(
            f"batchfleet demo: Redis at {url.split('@')[-1]}; synthetic GPU model: "
            "20 ms + 0.5 ms per item, one batch at a time"
        )
        with LocalFleet(env) as fleet, Producer(settings) as producer:
            fleet.start("batcher")
            fleet.start("worker", "--cpu")
            try:
                for model in DEMO_MODELS:
                    producer.result(producer.submit(model, "warmup"), timeout_s=READY_TIMEOUT_S)
            except BatchfleetError as exc:
                print(fleet.logs())
                raise BatchfleetError(f"the fleet did not start: {exc}") from exc
            print(
                f"fleet ready: {requests} requests at once, batched (max batch 32); "
                f"then {baseline} at once, one request per model call"
            )
            batched = load_run(producer, BATCHED, requests)
            single = load_run(producer, ONE_AT_A_TIME, baseline)
        forget_keys(url, prefix)
    print(
        f"{'run':<16} {'completed':>11} {'errors':>6} {'req/s':>9} "
        f"{'p50 ms':>8} {'p99 ms':>8} {'mean batch':>10}"
    )
    print(batched.line("batched"))
    print(single.line("one at a time"))
    if single.throughput > 0:
        print(f"batching: {batched.throughput / single.throughput:.1f}x the throughput")
    ok = batched.completed == requests and single.completed == baseline
    return 0 if ok else 1


def forget_keys(url: str, prefix: str) -> None:
    """Deletes the demo's keys (requests, results, Celery queues) from the user's Redis."""
    client = redis.Redis.from_url(url)
    try:
        for pattern in (f"{prefix}:*", f"{prefix}.*"):
            for key in client.scan_iter(match=pattern, count=1000):
                client.delete(key)
    finally:
        client.close()
