"""The admission script on a real redis-server: dedupe, id conflicts, the queue cap, unknown ids."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from config.errors import QueueFull, RequestIdConflict, UnknownRequest
from workers.local.local_fleet import LocalFleet

from .conftest import producer_for


def test_admission_script_on_real_redis(make_fleet: Callable[..., LocalFleet]) -> None:
    """The admission Lua behaves on real Redis as on fakeredis: dedupe, conflict, queue cap."""
    fleet = make_fleet(BATCHFLEET_MODELS__SYNTHETIC__MAX_QUEUE_LEN="3")
    with producer_for(fleet) as producer:
        assert producer.submit("synthetic", "a", request_id="same") == "same"
        assert producer.submit("synthetic", "a", request_id="same") == "same"
        with pytest.raises(RequestIdConflict):
            producer.submit("synthetic", "b", request_id="same")
        producer.submit_many("synthetic", ["c", "d"])
        started = time.monotonic()
        with pytest.raises(QueueFull):
            producer.submit("synthetic", "e")
        assert time.monotonic() - started < 1.0, "a full queue must refuse fast"
        with pytest.raises(UnknownRequest):
            producer.result("never-submitted", timeout_s=30)
