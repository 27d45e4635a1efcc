"""What one Celery task costs by itself: the floor under the pipeline's CPU per batch.

Run: .venv/bin/python benchmarks/celery_floor.py [--tasks 5000]
It starts a private redis-server and a Celery worker configured as batchfleet's workers are
(``make_celery_app``: late acks, prefetch 1, the threads pool with two slots, the fleet's
broker transport, per-task INFO logs off), whose task does nothing. This process sends the
tasks with ``apply_async``, as the batcher sends batches, and waits until the worker has
acked them all. It prints CPU milliseconds per task by process (from ``/proc``), with the
worker's task events off and on: Flower shows batches from those events.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import time

import redis
from pipeline_cpu import own_cpu_s, process_cpu_s  # this folder, as a script runs

from config.keys import Keys
from config.settings import ModelPolicy, Settings
from workers.local.local_redis import LocalRedis
from workers.protocol.celery_app import make_celery_app
from workers.runtime.process import PER_TASK_LOGGERS

MODEL = "noop"
TASK = "batchfleet.floor.noop"


def settings_from_env() -> Settings:
    return Settings(redis_url=os.environ["BATCHFLEET_REDIS_URL"], models={MODEL: ModelPolicy()})


def noop(batch_id: str) -> None:
    """A batch task with no batch to run."""


def serve(events: bool) -> None:
    """The worker: batchfleet's Celery configuration, with a task that does nothing."""
    settings = settings_from_env()
    app = make_celery_app(settings)
    app.task(name=TASK)(noop)
    for per_task in PER_TASK_LOGGERS:
        logging.getLogger(per_task).setLevel(logging.WARNING)
    app.Worker(
        pool="threads",
        concurrency=settings.worker.celery_concurrency,
        queues=[Keys(settings.key_prefix).celery_queue(MODEL)],
        loglevel="WARNING",
        task_events=events,
        without_gossip=True,
        without_mingle=True,
        without_heartbeat=True,
    ).start()


def settled(client: redis.Redis, queue: str) -> bool:
    """Whether the worker has taken and acked every task sent."""
    return client.llen(queue) == 0 and client.hlen("unacked") == 0


def measure(tasks: int, events: bool) -> dict[str, float]:
    """CPU seconds by process for ``tasks`` tasks, and the wall time they took."""
    with LocalRedis() as server:
        os.environ["BATCHFLEET_REDIS_URL"] = server.url
        settings = settings_from_env()
        command = [sys.executable, __file__, "--serve", *(["--events"] if events else [])]
        worker = subprocess.Popen(command, stdout=subprocess.DEVNULL)
        client = redis.Redis.from_url(server.url)
        app = make_celery_app(settings)
        queue = Keys(settings.key_prefix).celery_queue(MODEL)
        try:
            app.send_task(TASK, args=["warm-up"], queue=queue)
            while not settled(client, queue):
                time.sleep(0.05)
            readers = {
                "sender": own_cpu_s,
                "worker": lambda: process_cpu_s(worker.pid),
                "redis-server": lambda: process_cpu_s(server.pid),
            }
            before = {name: read() for name, read in readers.items()}
            started = time.monotonic()
            for n in range(tasks):
                app.send_task(TASK, args=[f"batch {n}"], queue=queue)
            while not settled(client, queue):
                time.sleep(0.05)
            used = {name: read() - before[name] for name, read in readers.items()}
            used["elapsed_s"] = time.monotonic() - started
        finally:
            worker.terminate()
            worker.wait()
            client.close()
            del os.environ["BATCHFLEET_REDIS_URL"]
    return used


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--events", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.events)
        return
    roles = ("sender", "worker", "redis-server")
    print(f"{args.tasks} no-op Celery tasks; CPU (user + system) by process, ms per task")
    header = " ".join(f"{role:>12}" for role in (*roles, "total"))
    print(f"{'task events':>11} {'tasks/s':>8} {header}")
    for events in (False, True):
        used = measure(args.tasks, events)
        per_task = [used[role] / args.tasks * 1e3 for role in roles]
        print(
            f"{'on' if events else 'off':>11} {args.tasks / used['elapsed_s']:>8.0f} "
            + " ".join(f"{value:>12.3f}" for value in per_task)
            + f" {sum(per_task):>12.3f}"
        )


if __name__ == "__main__":
    main()
