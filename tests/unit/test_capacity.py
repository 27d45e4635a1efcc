"""Worker liveness and batches in flight, as the batcher counts them (fakeredis)."""

from __future__ import annotations

from typing import Any

import fakeredis
import pytest
import redis

from config.keys import Keys
from workers.protocol.capacity import Dispatch, FleetState, RoomRule, worker_member
from workers.protocol.results import ResultWriter

LEASE_S = 45.0


def started(client: fakeredis.FakeRedis, batch_id: str, member: str) -> None:
    """``member``'s worker starts the batch (an empty one: only its owner is recorded)."""
    ResultWriter(client, Keys("bf"), "m").start_batch(batch_id, member, "w@test", [])


def test_live_workers_slots_and_batches_in_flight_are_counted(
    fake_redis: fakeredis.FakeRedis,
) -> None:
    """Slots add up over live workers; each dispatched batch takes one until it is done."""
    state = FleetState(fake_redis, Keys("bf"), "m")
    state.heartbeat(worker_member("a", 2), ttl_s=30)
    state.heartbeat(worker_member("b", 1), ttl_s=30)
    state.dispatched("batch-1", "size", LEASE_S)
    capacity = state.capacity(LEASE_S)
    assert (capacity.workers, capacity.slots, capacity.inflight) == (2, 3, 1)
    assert capacity.free_slots(batches_per_slot=1) == 2
    state.batch_done("batch-1", LEASE_S)()
    assert state.capacity(LEASE_S).inflight == 0


@pytest.mark.parametrize("step", ["send_packed_command", "read_response"])
def test_a_finished_batch_frees_its_slot_when_the_connection_drops(
    fake_redis: fakeredis.FakeRedis, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    """A worker gives a batch's slot back without waiting for Redis's reply; when Redis
    drops the connection as the worker sends it or reads the reply, the slot is given back
    all the same (sent again) and the worker sees no error."""
    state = FleetState(fake_redis, Keys("bf"), "m")
    state.heartbeat(worker_member("a", 1), ttl_s=30)
    state.dispatched("batch-1", "size", LEASE_S)
    connections = fake_redis.connection_pool.connection_class
    real = getattr(connections, step)
    dropped: list[str] = []

    def drop_once(connection: redis.Connection, *args: Any, **kwargs: Any) -> Any:
        if not dropped:
            dropped.append(step)
            raise redis.ConnectionError("Connection reset by peer")
        return real(connection, *args, **kwargs)

    monkeypatch.setattr(connections, step, drop_once)
    state.batch_done("batch-1", LEASE_S)()
    assert dropped == [step]
    assert state.capacity(LEASE_S).inflight == 0
    assert b"batch-1" in fake_redis.lrange(Keys("bf").slot_free("m"), 0, -1)


def test_a_dead_workers_batches_free_their_slots_at_once(fake_redis: fakeredis.FakeRedis) -> None:
    """When a worker's heartbeat is gone, the batches it had started stop counting, without
    waiting for the lease; batches not yet started keep their slot."""
    state = FleetState(fake_redis, Keys("bf"), "m")
    dead, alive = worker_member("dead", 1), worker_member("alive", 1)
    state.heartbeat(dead, ttl_s=30)
    state.heartbeat(alive, ttl_s=30)
    for batch in ("started-by-dead", "queued"):
        state.dispatched(batch, "size", LEASE_S)
    started(fake_redis, "started-by-dead", dead)
    assert state.capacity(LEASE_S).inflight == 2
    state.leave(dead)
    capacity = state.capacity(LEASE_S)
    assert (capacity.workers, capacity.inflight) == (1, 1)


def test_a_dispatch_counts_the_capacity_it_leaves(fake_redis: fakeredis.FakeRedis) -> None:
    """The batcher's next decision uses what its dispatch counted, in the same round trip:
    the new batch in flight, and what is gone pruned as ``capacity`` prunes it."""
    state = FleetState(fake_redis, Keys("bf"), "m")
    dead, alive = worker_member("dead", 1), worker_member("alive", 2)
    state.heartbeat(dead, ttl_s=30)
    state.heartbeat(alive, ttl_s=30)
    state.dispatched("started-by-dead", "size", LEASE_S)
    started(fake_redis, "started-by-dead", dead)
    state.leave(dead)
    counted = state.dispatched("next", "size", LEASE_S)
    assert (counted.workers, counted.slots, counted.inflight) == (1, 2, 1)
    assert counted == state.capacity(LEASE_S)


def test_a_batcher_waits_for_a_slot_freed_after_its_last_dispatch(
    fake_redis: fakeredis.FakeRedis,
) -> None:
    """A slot freed before a dispatch is counted in what that dispatch returns: its wake-up
    is spent, and the batcher's next wait for a slot is woken by a slot freed after it, not
    at once for the slot that batch took."""
    state = FleetState(fake_redis, Keys("bf"), "m")
    wake_ups = Keys("bf").slot_free("m")
    state.heartbeat(worker_member("a", 1), ttl_s=30)
    state.dispatched("first", "size", LEASE_S)
    state.batch_done("first", LEASE_S)()
    counted = state.dispatched("second", "size", LEASE_S)
    assert counted.free_slots(batches_per_slot=1) == 0
    assert fake_redis.lrange(wake_ups, 0, -1) == []
    state.batch_done("second", LEASE_S)()
    assert fake_redis.lrange(wake_ups, 0, -1) == [b"second"]


def test_a_dispatch_that_waited_for_room_sends_only_when_there_is_room(
    fake_redis: fakeredis.FakeRedis,
) -> None:
    """By the batcher's rule for a full batch (free slots plus one full batch ahead per live
    worker), a worker with one slot takes two batches: a third is not sent, and goes once
    one of the two is done."""
    state = FleetState(fake_redis, Keys("bf"), "m")
    queue = Keys("bf").celery_queue("m")
    state.heartbeat(worker_member("a", 1), ttl_s=30)
    state.dispatched("first", "size", LEASE_S)
    state.dispatched("second", "size", LEASE_S)

    def dispatch_when_room() -> Dispatch:
        with fake_redis.pipeline(transaction=False) as pipe:
            done = state.queue_dispatch(pipe, "third", "size", LEASE_S, "message", RoomRule(1, 1))
            (reply,) = pipe.execute(raise_on_error=False)
        return done(reply)

    refused = dispatch_when_room()
    assert (refused.sent, refused.capacity.inflight) == (False, 2)
    assert fake_redis.llen(queue) == 0
    state.batch_done("first", LEASE_S)()
    sent = dispatch_when_room()
    assert (sent.sent, sent.capacity.inflight) == (True, 2)
    assert fake_redis.lrange(queue, 0, -1) == [b"message"]
    assert sent.capacity == state.capacity(LEASE_S)
