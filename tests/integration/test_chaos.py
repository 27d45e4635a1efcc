"""Processes killed at the worst moment lose no request (real processes, SIGKILL)."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

import pytest
import redis

from config.keys import CONSUMER_GROUP, Keys
from workers.capacity import FleetState, worker_member
from workers.local_fleet import LocalFleet
from workers.models.synthetic import expected_output

from .conftest import check_outputs, producer_for, wait_ready

pytestmark = pytest.mark.slow

# Short limits so that recovery takes seconds: soft < hard < visibility < lease.
CHAOS_SETTINGS = {
    "BATCHFLEET_WORKER__SOFT_TIME_LIMIT_S": "1",
    "BATCHFLEET_WORKER__TIME_LIMIT_S": "2",
    "BATCHFLEET_WORKER__VISIBILITY_TIMEOUT_S": "5",
    "BATCHFLEET_BATCHER__RECLAIM_LEASE_S": "6",
    "BATCHFLEET_MODELS__SYNTHETIC__OPTIONS__BASE_MS": "150",
}


def held_by(client: redis.Redis, fleet: LocalFleet, consumer: str) -> int:
    """How many requests ``consumer`` holds in the model's stream (read, not yet final)."""
    stream = Keys(fleet.env["BATCHFLEET_KEY_PREFIX"]).requests("synthetic")
    try:
        consumers = client.xinfo_consumers(stream, CONSUMER_GROUP)
    except redis.ResponseError:  # the batcher has not created its group yet
        return 0
    for entry in consumers:
        if entry["name"] in (consumer, consumer.encode()):
            return int(entry["pending"])
    return 0


def wait_until(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Barrier on observable state: returns once ``condition`` holds, fails after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


@pytest.mark.parametrize("recovery", ["other worker", "restart"])
def test_worker_killed_mid_batch_loses_no_request(
    make_fleet: Callable[..., LocalFleet], redis_client: redis.Redis, recovery: str
) -> None:
    """SIGKILL of a worker while it runs a batch: every request still gets its one answer."""
    fleet = make_fleet(**CHAOS_SETTINGS)
    fleet.start("batcher")
    victim = fleet.start("worker", "--cpu", "--name", "victim@test")
    with producer_for(fleet) as producer:
        wait_ready(producer, fleet)
        if recovery == "other worker":
            fleet.start("worker", "--cpu", "--name", "survivor@test")
        inputs = [{"n": index} for index in range(300)]
        ids = producer.submit_many("synthetic", inputs)
        wait_until(lambda: held_by(redis_client, fleet, "worker:victim@test") > 0)
        fleet.stop(victim, signal.SIGKILL)
        if recovery == "restart":
            fleet.start("worker", "--cpu", "--name", "victim@test")
        results = {result.request_id: result for result in producer.results(ids, timeout_s=120)}
    check_outputs(
        {request_id: result.output for request_id, result in results.items()},
        {request_id: expected_output(value) for request_id, value in zip(ids, inputs, strict=True)},
    )
    if recovery == "other worker":
        assert any(result.worker == "survivor@test" for result in results.values())


@pytest.mark.parametrize("successor", ["b1", "b2"])
def test_batcher_killed_after_read_before_dispatch_loses_no_request(
    make_fleet: Callable[..., LocalFleet], redis_client: redis.Redis, successor: str
) -> None:
    """SIGKILL of a batcher holding read, undispatched requests: a restarted batcher (same
    name) resumes them at once, another batcher reclaims them after the lease."""
    # The first batcher sees one live worker that is busy and has a free slot: it reads the
    # requests and holds them for a fuller batch (a long window), undispatched.
    holding = make_fleet(**CHAOS_SETTINGS, BATCHFLEET_MODELS__SYNTHETIC__MAX_WAIT_S="60")
    state = FleetState(redis_client, Keys(holding.env["BATCHFLEET_KEY_PREFIX"]), "synthetic")
    state.heartbeat(worker_member("busy@test", 2), ttl_s=60)
    state.dispatched("running-batch")
    batcher = holding.start("batcher", "--name", "b1")
    with producer_for(holding) as producer:
        inputs = [f"request {index}" for index in range(20)]
        ids = producer.submit_many("synthetic", inputs)
        wait_until(lambda: held_by(redis_client, holding, "b1") == len(ids))
        holding.stop(batcher, signal.SIGKILL)
        state.leave(worker_member("busy@test", 2))
        state.undispatched("running-batch")
        fleet = make_fleet(**CHAOS_SETTINGS)
        fleet.start("worker", "--cpu")
        fleet.start("batcher", "--name", successor)
        results = {result.request_id: result for result in producer.results(ids, timeout_s=60)}
    check_outputs(
        {request_id: result.output for request_id, result in results.items()},
        {request_id: expected_output(value) for request_id, value in zip(ids, inputs, strict=True)},
    )


def test_batch_stuck_past_the_hard_limit_ends_its_worker_and_is_answered_by_another(
    make_fleet: Callable[..., LocalFleet],
) -> None:
    """With the threads pool, a model call past time_limit_s ends the worker process (Celery
    enforces no limit there); its request is reclaimed and answered by a fresh worker."""
    stuck = make_fleet(
        **{**CHAOS_SETTINGS, "BATCHFLEET_MODELS__SYNTHETIC__OPTIONS__BASE_MS": "60000"}
    )
    stuck.start("batcher")
    worker = stuck.start("worker", "--cpu", "--name", "stuck@test")
    with producer_for(stuck) as producer:
        request_id = producer.submit("synthetic", "slow")
        assert worker.wait(timeout=60) == 70, stuck.logs()
        assert "past the hard limit" in stuck.logs()
        healthy = make_fleet(**CHAOS_SETTINGS)
        healthy.start("worker", "--cpu", "--name", "fresh@test")
        assert producer.result(request_id, timeout_s=60) == expected_output("slow")
