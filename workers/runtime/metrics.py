"""Prometheus metrics a worker serves: what it measured itself.

Batch sizes, time in queue, model time, end-to-end latency, time busy in the model, and its
GPU's latest NVML reading. Label sets are bounded: served models, error codes, flush reasons,
worker names.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import threading
import time
from collections.abc import Iterable, Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

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


class BatchHistogram(Collector):
    """A histogram by model that takes a batch's values in one call. prometheus_client's
    ``Histogram`` takes one value a call, under its lock: two per request (queue wait and
    latency), ~2 µs each, were the worker's costliest metric. Exposed as a ``Histogram`` is
    (``_bucket``, ``_count``, ``_sum``; the same ``le`` labels), without ``_created``."""

    def __init__(
        self, name: str, documentation: str, buckets: Sequence[float] = LATENCY_BUCKETS_S
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._bounds = sorted(buckets)
        # As Histogram writes them; prometheus_client has no types here.
        self._le = [floatToGoString(bound) for bound in self._bounds] + ["+Inf"]  # type: ignore[no-untyped-call]
        # Per model: the count in each bucket (not cumulative; the last is +Inf), and the sum.
        self._counts: dict[str, list[int]] = {}
        self._sums: dict[str, float] = {}
        self._lock = threading.Lock()

    def observe_many(self, model: str, values: Iterable[float]) -> None:
        counts = [0] * len(self._le)
        total = 0.0
        for value in values:
            counts[bisect.bisect_left(self._bounds, value)] += 1
            total += value
        with self._lock:
            kept = self._counts.setdefault(model, [0] * len(self._le))
            for index, count in enumerate(counts):
                kept[index] += count
            self._sums[model] = self._sums.get(model, 0.0) + total

    def collect(self) -> Iterable[Metric]:
        family = HistogramMetricFamily(self._name, self._documentation, labels=["model"])
        with self._lock:
            series = [
                (model, list(counts), self._sums[model]) for model, counts in self._counts.items()
            ]
        for model, counts, total in series:
            cumulative = itertools.accumulate(counts)
            family.add_metric([model], list(zip(self._le, cumulative, strict=True)), total)
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
        self._queue_s = BatchHistogram(
            "batchfleet_queue_wait_seconds",
            "Time from submit to the start of the request's model call.",
        )
        self._latency_s = BatchHistogram(
            "batchfleet_request_latency_seconds",
            "Time from submit to the request's answer being written.",
        )
        self.registry.register(self._queue_s)
        self.registry.register(self._latency_s)
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
        submitted = [request.submitted_at for request in requests]
        self._queue_s.observe_many(model, [max(0.0, started_at - at) for at in submitted])
        self._latency_s.observe_many(model, [max(0.0, written_at - at) for at in submitted])
