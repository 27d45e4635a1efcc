"""Priorities without starvation: under a flood of high-priority requests past the fleet's
capacity, low-priority requests yield to them but are all answered while the flood goes on."""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Callable

import pytest

from config.errors import InvalidInput
from workers.local_fleet import LocalFleet

from .conftest import producer_for, wait_ready

AGING_S = 1.0


def test_low_priority_is_served_under_a_saturating_high_priority_flood(
    make_fleet: Callable[..., LocalFleet],
) -> None:
    policy = {
        "priorities": True,
        "priority_aging_s": AGING_S,
        "max_batch_size": 8,
        "options": {"base_ms": 20, "per_item_ms": 0},
    }
    fleet = make_fleet(BATCHFLEET_MODELS=json.dumps({"synthetic": policy}))
    fleet.start("batcher")
    fleet.start("worker", "--cpu")
    flooding = threading.Event()
    high_ids: list[str] = []
    with producer_for(fleet) as producer, producer_for(fleet) as flooder:
        wait_ready(producer, fleet)

        def flood() -> None:
            # ~600 requests/s against a capacity of 8 per 20 ms (~400/s): the backlog grows.
            while flooding.is_set():
                high_ids.extend(flooder.submit_many("synthetic", list(range(30)), priority="high"))
                time.sleep(0.05)

        flooding.set()
        flooder_thread = threading.Thread(target=flood)
        flooder_thread.start()
        try:
            time.sleep(1.0)  # the high backlog is building
            sent_at = time.time()
            low_ids = producer.submit_many("synthetic", ["low"] * 20, priority="low")
            lows = list(producer.results(low_ids, timeout_s=60))
            still_flooding = flooding.is_set()
            backlog = len(high_ids)
        finally:
            flooding.clear()
            flooder_thread.join()
        highs = list(producer.results(high_ids, timeout_s=120))
    assert still_flooding and all(result.ok for result in lows)
    low_waits = [result.finished_at - sent_at for result in lows]
    assert statistics.median(low_waits) >= AGING_S, "low requests did not yield to high ones"
    assert all(result.ok for result in highs) and backlog > 0


def test_a_priority_for_a_model_without_priorities_is_refused(
    make_fleet: Callable[..., LocalFleet],
) -> None:
    fleet = make_fleet()
    with producer_for(fleet) as producer, pytest.raises(InvalidInput, match="priorities"):
        producer.submit("synthetic", "x", priority="high")
