"""A worker's per-request histograms take a batch's values at once and read as Histograms do."""

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from workers.runtime.metrics import LATENCY_BUCKETS_S, BatchHistogram

VALUES = [0.0, 0.005, 0.0051, 0.3, 1.0, 299.0, 300.0, 301.0, 12.5]


def samples(registry: CollectorRegistry) -> dict[str, float]:
    """Each sample of the registry's text exposition by its name and labels, without the
    ``_created`` ones."""
    lines = generate_latest(registry).decode().splitlines()
    pairs = [line.rsplit(" ", 1) for line in lines if not line.startswith("#")]
    return {name: float(value) for name, value in pairs if "_created" not in name}


def test_a_batch_observed_at_once_reads_as_each_value_observed_by_a_histogram() -> None:
    """Same buckets (a value on a bound counts in it), count and sum, per model."""
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    batch = BatchHistogram("wait_seconds", "Wait.")
    ours.register(batch)
    histogram = Histogram(
        "wait_seconds", "Wait.", ["model"], buckets=LATENCY_BUCKETS_S, registry=theirs
    )
    batch.observe_many("a", VALUES[:4])
    batch.observe_many("a", VALUES[4:])
    batch.observe_many("b", [0.02])
    for value in VALUES:
        histogram.labels("a").observe(value)
    histogram.labels("b").observe(0.02)
    # The sums may differ in the last digit: the batch adds its values in another order.
    assert samples(ours) == pytest.approx(samples(theirs))
