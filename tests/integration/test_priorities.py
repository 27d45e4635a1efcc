"""Priorities without starvation: under a flood of high-priority requests past the fleet's
capacity, low-priority requests yield to them but are all answered while the flood goes on."""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Callable

import pytest
import redis

from config.errors import InvalidInput
from config.keys import Keys
from tests.chaos.harness import wait_until
from workers.local.local_fleet import LocalFleet

from .conftest import producer_for, settings_for, wait_ready

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
    settings = settings_for(fleet.env)
    stream = Keys(settings.key_prefix).stream("synthetic")
    client = redis.Redis.from_url(settings.redis_url.get_secret_value())
    with producer_for(fleet) as producer, producer_for(fleet) as flooder:
        wait_ready(producer, fleet)

        def flood() -> None:
            # ~800 requests/s against a capacity of 8 per 20 ms (~400/s): the backlog grows.
            while flooding.is_set():
                high_ids.extend(flooder.submit_many("synthetic", list(range(40)), priority="high"))
                time.sleep(0.05)

        flooding.set()
        flooder_thread = threading.Thread(target=flood)
        flooder_thread.start()
        try:
            wait_until(lambda: client.xlen(stream) > 200)  # a backlog of high requests
            sent_at = time.time()
            low_ids = producer.submit_many("synthetic", ["low"] * 20, priority="low")
            highs_sent_before = len(high_ids)
            lows = list(producer.results(low_ids, timeout_s=60))
            highs_sent_meanwhile = len(high_ids) - highs_sent_before
        finally:
            flooding.clear()
            flooder_thread.join()
        highs = list(producer.results(high_ids, timeout_s=120))
    client.close()
    assert all(result.ok for result in lows)
    assert highs_sent_meanwhile > 0, "the flood ended before the low requests were answered"
    low_waits = [result.finished_at - sent_at for result in lows]
    assert statistics.median(low_waits) >= AGING_S, "low requests did not yield to high ones"
    assert all(result.ok for result in highs)


def test_a_priority_for_a_model_without_priorities_is_refused(
    make_fleet: Callable[..., LocalFleet],
) -> None:
    fleet = make_fleet()
    with producer_for(fleet) as producer, pytest.raises(InvalidInput, match="priorities"):
        producer.submit("synthetic", "x", priority="high")
