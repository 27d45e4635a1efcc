"""Prometheus metrics: what the batcher and each worker serve on ``/metrics``.

The batcher serves the fleet's view of each model, read from Redis at scrape time: queue
depth and oldest request age, and the request and batch counters that producers, batchers and
workers keep in ``bf:m:{model}:stats``. Every batcher of a fleet serves the same figures
(aggregate them with ``max``, not ``sum``). Each worker serves what it measured itself:
batch sizes, time in queue, model time, end-to-end latency, time busy in the model, and its
GPU's latest NVML reading. Label sets are bounded: served models, error codes, flush reasons,
worker names.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any

import redis
from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from config.keys import Keys
from config.schema import Request
from workers.entries import to_text
from workers.gpu import GpuTelemetry

log = logging.getLogger(__name__)

LATENCY_BUCKETS_S = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
)  # fmt: skip
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def serve_metrics(registry: CollectorRegistry, port: int, host: str) -> None:
    """Serves ``registry`` on ``http://host:port/metrics`` from a daemon thread."""
    start_http_server(port, addr=host, registry=registry)
    log.info("metrics on http://%s:%d/metrics", host, port)


class FleetCollector(Collector):
    """Reads each served model's queue and counters from Redis when Prometheus scrapes."""

    def __init__(self, client: redis.Redis, keys: Keys, models: Sequence[str]) -> None:
        self._client = client
        self._keys = keys
        self._models = list(models)

    def collect(self) -> Iterable[Metric]:
        pipe = self._client.pipeline(transaction=False)
        for model in self._models:
            pipe.xlen(self._keys.requests(model))
            pipe.xrange(self._keys.requests(model), count=1)
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
                kind, _, label = field.partition(":")
                if kind == "accepted" or kind == "completed":
                    families[kind].add_metric([model], count)
                elif kind in ("refused", "failed", "batches", "cache"):
                    families[kind].add_metric([model, label], count)
                    if field == "failed:expired":
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


class GpuCollector(Collector):
    """The pinned GPU's latest NVML reading (taken every heartbeat), when there is one."""

    def __init__(self, telemetry: GpuTelemetry, worker: str) -> None:
        self._telemetry = telemetry
        self._worker = worker

    def collect(self) -> Iterable[Metric]:
        reading = self._telemetry.latest
        if reading is None:
            return
        labels = [self._worker, str(reading.index)]
        figures = [
            (
                "utilisation_ratio",
                "GPU busy fraction over NVML's sample period.",
                reading.utilisation,
            ),
            ("memory_used_bytes", "GPU memory in use.", reading.memory_used_bytes),
            ("memory_total_bytes", "GPU memory in all.", reading.memory_total_bytes),
            ("temperature_celsius", "GPU temperature.", reading.temperature_c),
            ("power_watts", "GPU power draw.", reading.power_w),
        ]
        for name, documentation, value in figures:
            if value is None:
                continue
            family = GaugeMetricFamily(
                f"batchfleet_gpu_{name}", documentation, labels=["worker", "gpu"]
            )
            family.add_metric(labels, value)
            yield family


class WorkerMetrics:
    """What one worker process measures of the batches it runs."""

    def __init__(self, telemetry: GpuTelemetry, worker: str, models: Sequence[str] = ()) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(GpuCollector(telemetry, worker))
        self._batch_size = self._histogram(
            "batchfleet_batch_size", "Inputs per model call.", BATCH_SIZE_BUCKETS
        )
        self._model_s = self._histogram(
            "batchfleet_model_seconds", "Time inside the model per call."
        )
        self._queue_s = self._histogram(
            "batchfleet_queue_wait_seconds",
            "Time from submit to the start of the request's model call.",
        )
        self._latency_s = self._histogram(
            "batchfleet_request_latency_seconds",
            "Time from submit to the request's answer being written.",
        )
        self._busy_s = Counter(
            "batchfleet_worker_busy_seconds",
            "Time inside the model; its rate is the worker's busy fraction.",
            ["model"],
            registry=self.registry,
        )
        for model in models:  # series from the start: a worker that never ran one is seen
            for family in (self._batch_size, self._busy_s):
                family.labels(model)

    def _histogram(
        self, name: str, documentation: str, buckets: Sequence[float] = LATENCY_BUCKETS_S
    ) -> Histogram:
        return Histogram(name, documentation, ["model"], buckets=buckets, registry=self.registry)

    def observe_run(
        self, model: str, requests: Sequence[Request], model_s: float, finished_at: float
    ) -> None:
        """One model call over ``requests``, answered at ``finished_at`` (wall clock)."""
        self._batch_size.labels(model).observe(len(requests))
        self._model_s.labels(model).observe(model_s)
        self._busy_s.labels(model).inc(model_s)
        started_at = finished_at - model_s
        written_at = time.time()
        for request in requests:
            self._queue_s.labels(model).observe(max(0.0, started_at - request.submitted_at))
            self._latency_s.labels(model).observe(max(0.0, written_at - request.submitted_at))
