"""Deadline-aware batching on a real fleet: a batch held to grow while its device is busy is
sent ahead, in time for its deadline at the model time the workers measured, instead of
waiting for the device to free."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from config.keys import Keys
from tests.chaos.harness import wait_until
from workers.local.local_fleet import LocalFleet
from workers.protocol.model_times import REFRESH_S

from .conftest import producer_for, settings_for, wait_ready
from .test_cancel import LEDGER, on_device


@pytest.mark.parametrize("deadline_aware", [True, False])
def test_a_held_batch_is_sent_ahead_for_its_deadline_only_when_deadline_aware(
    make_fleet: Callable[..., LocalFleet], tmp_path: Path, deadline_aware: bool
) -> None:
    """Batches may wait 5 s to grow. The worker has measured ~0.3 s calls (stalled warm-ups)
    and is busy for 1.5 s when a request due in 1.6 s arrives: a deadline-aware batcher sends
    it at ~1.3 s (``deadline``), to start the moment the device frees; a plain one holds it
    until the device is idle."""
    options = {"executions_path": str(tmp_path / "executions"), "base_ms": 5}
    policy = {"backend": LEDGER, "options": options, "late_binding": False, "max_wait_s": 5.0}
    policy["deadline_aware"] = deadline_aware
    fleet = make_fleet(BATCHFLEET_MODELS=json.dumps({"synthetic": policy}))
    fleet.start("batcher")
    fleet.start("worker", "--cpu")
    settings = settings_for(fleet.env)
    keys = Keys(settings.key_prefix)
    client = redis.Redis.from_url(settings.redis_url.get_secret_value())
    with producer_for(fleet) as producer:
        wait_ready(producer, fleet, warmup={"n": 0})
        for n in range(1, 5):
            producer.result(producer.submit("synthetic", {"n": n, "stall_s": 0.5}), timeout_s=30)
        wait_until(lambda: float(client.hget(keys.model_time("synthetic"), "1") or 0) > 0.25)
        time.sleep(REFRESH_S)  # the batcher's next look at the model times reads these
        blocker = producer.submit("synthetic", {"n": 10, "stall_s": 1.5})
        wait_until(lambda: on_device(client, keys))
        due = producer.submit("synthetic", {"n": 11}, deadline_s=1.6)
        results = {r.request_id: r for r in producer.results([blocker, due], timeout_s=30)}
    client.close()
    if deadline_aware:
        assert results[due].ok and results[due].flush_reason == "deadline"
    else:
        assert results[due].flush_reason != "deadline"
