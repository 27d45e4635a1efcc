"""Prometheus metrics the batcher serves: the fleet's view of each model, read from Redis.

Queue depth and oldest request age, and the request and batch counters that producers,
batchers and workers keep in ``bf:{m:MODEL}:stats`` (fields named in ``config.stats_fields``),
read at scrape time. Every batcher of a
fleet serves the same figures (aggregate them with ``max``, not ``sum``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

import redis
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from config import stats_fields
from config.keys import Keys
from workers.protocol.entries import to_text

log = logging.getLogger(__name__)


class FleetCollector(Collector):
    """Reads each served model's queue and counters from Redis when Prometheus scrapes."""

    def __init__(self, client: redis.Redis, keys: Keys, models: Sequence[str]) -> None:
        self._client = client
        self._keys = keys
        self._models = list(models)

    def collect(self) -> Iterable[Metric]:
        pipe = self._client.pipeline(transaction=False)
        for model in self._models:
            pipe.xlen(self._keys.stream(model))
            pipe.xrange(self._keys.stream(model), count=1)
            pipe.hgetall(self._keys.stats(model))
        pipe.time()
        try:
            replies: list[Any] = pipe.execute()
        except redis.RedisError as exc:
            log.warning("metrics: Redis unreadable: %s", exc)
            return
        seconds, micros = replies[-1]
        now = seconds + micros / 1e6
        families = _fleet_families()
        for index, model in enumerate(self._models):
            depth, oldest, stats = replies[3 * index : 3 * index + 3]
            families["depth"].add_metric([model], depth)
            age = now - int(to_text(oldest[0][0]).split("-")[0]) / 1000 if oldest else 0.0
            families["age"].add_metric([model], max(0.0, age))
            for field, count in sorted((to_text(k), int(v)) for k, v in stats.items()):
                kind, label = stats_fields.parse(field)
                if field in (stats_fields.ACCEPTED, stats_fields.COMPLETED):
                    families[kind].add_metric([model], count)
                elif kind in stats_fields.LABELLED:
                    families[kind].add_metric([model, label], count)
                    if field == stats_fields.failed("expired"):
                        families["expired"].add_metric([model], count)
        yield from families.values()


def _fleet_families() -> dict[str, Any]:
    return {
        "depth": GaugeMetricFamily(
            "batchfleet_queue_depth",
            "Requests accepted and not yet answered (waiting or running).",
            labels=["model"],
        ),
        "age": GaugeMetricFamily(
            "batchfleet_queue_oldest_age_seconds",
            "Age of the oldest request not yet answered; 0 when the queue is empty.",
            labels=["model"],
        ),
        "accepted": CounterMetricFamily(
            "batchfleet_requests_accepted", "Requests accepted into the queue.", labels=["model"]
        ),
        "refused": CounterMetricFamily(
            "batchfleet_requests_refused",
            "Requests refused at submit, by reason.",
            labels=["model", "reason"],
        ),
        "completed": CounterMetricFamily(
            "batchfleet_requests_completed", "Requests answered with an output.", labels=["model"]
        ),
        "failed": CounterMetricFamily(
            "batchfleet_requests_failed",
            "Requests answered with an error, by error code (expired included).",
            labels=["model", "reason"],
        ),
        "expired": CounterMetricFamily(
            "batchfleet_requests_expired",
            "Requests dropped because their deadline passed before they ran.",
            labels=["model"],
        ),
        "cache": CounterMetricFamily(
            "batchfleet_cache_requests",
            "Submits looked up in the model's response cache, by result (hit, miss).",
            labels=["model", "result"],
        ),
        "batches": CounterMetricFamily(
            "batchfleet_batches",
            "Batches the batchers sent, by flush reason (size, wait, budget, slot, idle...).",
            labels=["model", "reason"],
        ),
    }


def batcher_registry(client: redis.Redis, keys: Keys, models: Sequence[str]) -> CollectorRegistry:
    """The batcher's metrics: the fleet's view of ``models``."""
    registry = CollectorRegistry()
    registry.register(FleetCollector(client, keys, models))
    return registry
