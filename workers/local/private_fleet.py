"""A whole fleet on this machine for the demo and the benchmarks: Redis, a batcher, N workers."""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from config.connection import connect
from config.errors import BatchfleetError
from config.settings import Settings, load_settings
from producer.admission import chunks
from producer.client import Producer
from workers.local.local_fleet import LocalFleet
from workers.local.local_redis import LocalRedis
from workers.protocol.entries import to_text
from workers.runtime.cpu_core import spare_cores

READY_TIMEOUT_S = 60.0
SCAN_PAGE = 1000  # keys a SCAN step returns and one UNLINK deletes
# The one key Celery's Redis transport shares between exchanges: binding deadlines by name.
KOMBU_BINDING_DEADLINES = "_kombu.binding_deadlines"


@dataclass(frozen=True)
class PrivateFleet:
    """A running private fleet: its settings, its processes, the Redis it uses."""

    settings: Settings
    processes: LocalFleet
    redis_url: str


@contextlib.contextmanager
def redis_url_for_run() -> Iterator[str]:
    """The user's Redis when BATCHFLEET_REDIS_URL is set, else a private one for this run."""
    url = os.environ.get("BATCHFLEET_REDIS_URL")
    if url:
        yield url
        return
    with LocalRedis() as server:
        yield server.url


@contextlib.contextmanager
def private_fleet(
    models: dict[str, dict[str, Any]], workers: int = 1, gpus: int = 0, pin_cores: bool = False
) -> Iterator[PrivateFleet]:
    """Starts a batcher and ``workers`` workers serving ``models`` under a fresh key prefix (on
    the CPU, or pinned round-robin to ``gpus`` GPUs; with ``pin_cores``, each to a CPU core,
    ``spare_cores``), waits until each model answers, and on exit stops them and deletes the
    run's keys.

    Raises:
        BatchfleetError: the fleet did not answer within a minute (its logs are printed).
    """
    prefix = f"run-{uuid.uuid4().hex[:8]}"
    with redis_url_for_run() as url:
        env = {
            "BATCHFLEET_REDIS_URL": url,
            "BATCHFLEET_KEY_PREFIX": prefix,
            "BATCHFLEET_MODELS": json.dumps(models),
        }
        settings = load_settings(redis_url=url, key_prefix=prefix, models=models)
        try:
            with LocalFleet(env) as processes:
                processes.start("batcher")
                cores = spare_cores(workers) if pin_cores else []
                for index in range(workers):
                    placement = ["--gpu", str(index % gpus)] if gpus else ["--cpu"]
                    if cores:
                        placement += ["--core", str(cores[index])]
                    processes.start("worker", *placement, "--name", f"w{index}@{prefix}")
                wait_until_serving(settings, processes)
                yield PrivateFleet(settings, processes, url)
        finally:
            forget_keys(settings)


def wait_until_serving(settings: Settings, processes: LocalFleet) -> None:
    """Barrier: one request per model makes the whole path before the run starts."""
    with Producer(settings) as producer:
        try:
            for model in settings.models:
                producer.result(producer.submit(model, "warmup"), timeout_s=READY_TIMEOUT_S)
        except BatchfleetError as exc:
            print(processes.logs())
            raise BatchfleetError(f"the fleet did not start: {exc}") from exc


def forget_keys(settings: Settings) -> None:
    """Deletes a run's keys from Redis: requests, results, and what Celery's transport keeps
    for its queues, events and remote control (exchanges named after the prefix), including
    the run's exchanges in the transport's one shared key."""
    prefix = settings.key_prefix
    exchanges = (f"{prefix}.", f"reply.{prefix}.")
    patterns = [f"{prefix}:*", f"{prefix}.*"]
    patterns += [
        f"_kombu.{table}.{exchange}*"
        for table in ("binding", "binding_permanent")
        for exchange in exchanges
    ]
    client = connect(settings)
    try:
        for pattern in patterns:
            keys = list(client.scan_iter(match=pattern, count=SCAN_PAGE))
            for page in chunks(keys, SCAN_PAGE):
                client.unlink(*page)
        members: list[bytes] = client.zrange(KOMBU_BINDING_DEADLINES, 0, -1)  # type: ignore[assignment]
        ours = [member for member in members if to_text(member).startswith(exchanges)]
        if ours:
            client.zrem(KOMBU_BINDING_DEADLINES, *ours)
    finally:
        client.close()
