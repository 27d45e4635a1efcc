"""Prometheus /metrics of a running fleet: the batcher's view of the model, each worker's
own measurements, and both moving with real traffic."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from config.errors import InputTooLarge
from workers.local.local_fleet import LocalFleet
from workers.local.local_redis import free_port

from .conftest import producer_for, wait_ready

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
SYNTHETIC = (("model", "synthetic"),)


def scrape(port: int, timeout_s: float = 30.0) -> Samples:
    """Every sample ``/metrics`` serves on ``port``, by name and labels (retried until the
    process serves)."""
    give_up = time.monotonic() + timeout_s
    while True:
        try:
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
            break
        except httpx.TransportError:
            if time.monotonic() > give_up:
                raise
            time.sleep(0.1)
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def moved(before: Samples, after: Samples, name: str, labels: tuple = SYNTHETIC) -> float:
    return after.get((name, labels), 0.0) - before.get((name, labels), 0.0)


def test_the_fleet_serves_metrics_that_move_with_real_traffic(
    make_fleet: Callable[..., LocalFleet],
) -> None:
    """200 requests, one refused at the edge and one that expires before any worker runs:
    the batcher counts each, the worker measured each request and batch, and the queue is
    empty again; both answer their liveness and readiness probes while they serve."""
    batcher_port, worker_port = free_port(), free_port()
    fleet = make_fleet(BATCHFLEET_MODELS=json.dumps({"synthetic": {"max_input_bytes": 1024}}))
    fleet.start("batcher", "--metrics-port", str(batcher_port))
    with producer_for(fleet) as producer:
        start = scrape(batcher_port)
        late = producer.submit("synthetic", "no worker yet", deadline_s=0.05)
        (expired,) = list(producer.results([late], timeout_s=30))
        assert expired.error is not None and expired.error.code == "expired"
        with pytest.raises(InputTooLarge):
            producer.submit("synthetic", "x" * 2048)
        fleet.start("worker", "--cpu", "--metrics-port", str(worker_port))
        wait_ready(producer, fleet)
        before, worker_before = scrape(batcher_port), scrape(worker_port)
        for port in (batcher_port, worker_port):  # the pods' probes: serving, so both 200
            for probe in ("/livez", "/readyz"):
                response = httpx.get(f"http://127.0.0.1:{port}{probe}", timeout=5)
                assert response.status_code == 200, (port, probe)
        ids = producer.submit_many("synthetic", [f"item {index}" for index in range(200)])
        results = list(producer.results(ids, timeout_s=60))
    assert all(result.ok for result in results)
    after, worker_after = scrape(batcher_port), scrape(worker_port)

    expired_code = (*SYNTHETIC, ("reason", "expired"))
    assert moved(start, before, "batchfleet_requests_failed_total", expired_code) == 1
    assert moved(start, before, "batchfleet_requests_expired_total") == 1
    refused = (*SYNTHETIC, ("reason", "too_large"))
    assert moved(start, before, "batchfleet_requests_refused_total", refused) == 1
    assert moved(before, after, "batchfleet_requests_accepted_total") == 200
    assert moved(before, after, "batchfleet_requests_completed_total") == 200
    assert after[("batchfleet_queue_depth", SYNTHETIC)] == 0
    assert after[("batchfleet_queue_oldest_age_seconds", SYNTHETIC)] == 0
    batches = sum(
        value - before.get(key, 0.0)
        for key, value in after.items()
        if key[0] == "batchfleet_batches_total"
    )
    assert 1 <= batches <= 200

    assert moved(worker_before, worker_after, "batchfleet_batch_size_sum") == 200
    calls = moved(worker_before, worker_after, "batchfleet_batch_size_count")
    assert 1 <= calls <= 200
    assert moved(worker_before, worker_after, "batchfleet_model_seconds_count") == calls
    assert moved(worker_before, worker_after, "batchfleet_request_latency_seconds_count") == 200
    assert moved(worker_before, worker_after, "batchfleet_queue_wait_seconds_count") == 200
    busy = moved(worker_before, worker_after, "batchfleet_worker_busy_seconds_total")
    # The synthetic model sleeps 20 ms + 0.5 ms per input under the device lock.
    assert busy >= calls * 0.02 + 200 * 0.0005 - 0.01
    assert not any(name.startswith("batchfleet_gpu_") for name, _ in worker_after)
