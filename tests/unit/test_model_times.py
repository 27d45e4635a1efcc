"""Model time per batch size: a worker's running means, and a batcher's estimate from them."""

from __future__ import annotations

import fakeredis
import pytest

from config.keys import Keys
from workers.protocol.model_times import (
    EWMA_WEIGHT,
    MeasuredModelTimes,
    ModelTimeEstimate,
    bucket_of,
)

KEYS = Keys("bf")


def test_sizes_are_measured_in_power_of_two_buckets() -> None:
    assert [bucket_of(size) for size in (1, 2, 3, 4, 5, 32, 33)] == [1, 2, 4, 4, 8, 32, 64]


def test_a_worker_keeps_a_running_mean_per_model_and_bucket() -> None:
    times = MeasuredModelTimes()
    times.add("m", 3, 0.100)
    times.add("m", 4, 0.200)
    times.add("m", 1, 0.010)
    means = times.fields()["m"]
    assert float(means["4"]) == pytest.approx(0.100 + EWMA_WEIGHT * 0.100)
    assert float(means["1"]) == pytest.approx(0.010)


def test_a_batcher_prices_a_size_from_the_smallest_bucket_that_holds_it() -> None:
    client = fakeredis.FakeRedis()
    estimate = ModelTimeEstimate(client, KEYS, "m")
    assert estimate.seconds(8) == 0.0, "nothing measured yet"
    client.hset(KEYS.model_time("m"), mapping={"1": "0.01", "8": "0.05", "16": "0.08"})
    estimate = ModelTimeEstimate(client, KEYS, "m")
    assert estimate.seconds(2) == pytest.approx(0.05)
    assert estimate.seconds(16) == pytest.approx(0.08)
    assert estimate.seconds(64) == pytest.approx(0.08 * 64 / 16)
