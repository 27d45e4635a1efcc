"""Prometheus metrics a worker serves: what it measured itself.

Batch sizes, time in queue, model time, end-to-end latency, time busy in the model, and its
GPU's latest NVML reading. Label sets are bounded: served models, error codes, flush reasons,
worker names.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from config.schema import Request
from workers.runtime.gpu import GpuTelemetry

log = logging.getLogger(__name__)

LATENCY_BUCKETS_S = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
)  # fmt: skip
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


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
        queue_s, latency_s = self._queue_s.labels(model), self._latency_s.labels(model)
        for request in requests:
            queue_s.observe(max(0.0, started_at - request.submitted_at))
            latency_s.observe(max(0.0, written_at - request.submitted_at))
