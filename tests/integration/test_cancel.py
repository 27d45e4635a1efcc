"""Cancellation: a queued request never runs, a running one's output is discarded, and a
producer asked to cancels what it was waiting for when it closes or its task is cancelled."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis

from config.errors import RequestCancelled, UnknownRequest
from config.keys import CONSUMER_GROUP, Keys, held_on_device
from producer.async_client import AsyncProducer
from producer.client import Producer
from tests.waiters import names_waiter
from workers.local.local_fleet import LocalFleet

from .conftest import settings_for, wait_ready

LEDGER = "tests.chaos.ledger_model:LedgerModel"


def ledger_fleet(
    make_fleet: Callable[..., LocalFleet], executions: Path, **policy: object
) -> LocalFleet:
    """A fleet serving the chaos suite's model, which appends each input's ``n`` it runs to
    ``executions``; only its batcher is started."""
    options = {"executions_path": str(executions), "base_ms": 5}
    models = {"synthetic": {"backend": LEDGER, "options": options, **policy}}
    fleet = make_fleet(BATCHFLEET_MODELS=json.dumps(models))
    fleet.start("batcher")
    return fleet


def executed(executions: Path) -> list[int]:
    return [int(n) for n in executions.read_text().split()] if executions.exists() else []


def cancelled(producer: Producer, request_id: str) -> bool:
    with pytest.raises(RequestCancelled):
        producer.result(request_id, timeout_s=30)
    return True


def on_device(client: redis.Redis, keys: Keys) -> bool:
    """Whether a worker's device holds a request of the model now (its batch is running)."""
    pending = client.xpending_range(keys.stream("synthetic"), CONSUMER_GROUP, "-", "+", 10)
    return any(held_on_device(row["consumer"].decode()) for row in pending)


def wait_until_on_device(client: redis.Redis, keys: Keys) -> None:
    give_up = time.monotonic() + 30
    while not on_device(client, keys):
        assert time.monotonic() < give_up, "the request never reached the device"
        time.sleep(0.02)


def test_a_queued_request_cancelled_never_runs_and_its_neighbours_do(
    make_fleet: Callable[..., LocalFleet], tmp_path: Path
) -> None:
    executions = tmp_path / "executions"
    fleet = ledger_fleet(make_fleet, executions)
    settings = settings_for(fleet.env)
    keys = Keys(settings.key_prefix)
    client = redis.Redis.from_url(settings.redis_url.get_secret_value())
    with Producer(settings) as producer:
        first, second, third = producer.submit_many("synthetic", [{"n": n} for n in (1, 2, 3)])
        assert producer.cancel(second) is True
        assert cancelled(producer, second)
        assert client.xlen(keys.stream("synthetic")) == 2, "the cancelled entry left the queue"
        assert client.hget(keys.stats("synthetic"), "failed:cancelled") == b"1"
        fleet.start("worker", "--cpu")
        answers = {r.request_id: r for r in producer.results([first, third], timeout_s=60)}
        assert answers[first].output == {"echo": {"n": 1}}
        assert producer.cancel(first) is False, "an answered request stays answered"
        with pytest.raises(UnknownRequest):
            producer.cancel("never-submitted")
    assert sorted(executed(executions)) == [1, 3]
    assert cancelled(Producer(settings), second)
    client.close()


def test_a_running_request_cancelled_answers_its_caller_at_once_and_its_output_is_dropped(
    make_fleet: Callable[..., LocalFleet], tmp_path: Path
) -> None:
    """Cancelling a request on the device answers its caller while the batch still runs (the
    worker is frozen meanwhile, so it cannot finish first on any machine); the output it
    then produces is dropped, and the worker goes on."""
    executions = tmp_path / "executions"
    fleet = ledger_fleet(make_fleet, executions)
    worker = fleet.start("worker", "--cpu")
    settings = settings_for(fleet.env)
    keys = Keys(settings.key_prefix)
    client = redis.Redis.from_url(settings.redis_url.get_secret_value())
    with Producer(settings) as producer:
        wait_ready(producer, fleet, warmup={"n": 0})
        slow = producer.submit("synthetic", {"n": 7, "stall_s": 3})
        wait_until_on_device(client, keys)
        os.killpg(worker.pid, signal.SIGSTOP)
        try:
            assert producer.cancel(slow) is True
            assert cancelled(producer, slow)
            # Its entry left the stream's ledger, the device consumer's included: should the
            # process die now, nothing would take it back to run again.
            assert not on_device(client, keys)
        finally:
            os.killpg(worker.pid, signal.SIGCONT)
        producer.infer("synthetic", [{"n": 8}])  # runs after the stalled batch
        assert cancelled(producer, slow)
    assert executed(executions) == [0, 7, 8]
    stats = client.hgetall(keys.stats("synthetic"))
    assert stats[b"failed:cancelled"] == b"1" and stats[b"completed"] == b"2"
    client.close()


def test_leaving_a_producer_block_cancels_what_it_was_waiting_for(
    make_fleet: Callable[..., LocalFleet], tmp_path: Path
) -> None:
    executions = tmp_path / "executions"
    fleet = ledger_fleet(make_fleet, executions)
    settings = settings_for(fleet.env)
    with Producer(settings, cancel_on_exit=True) as producer:
        ids = producer.submit_many("synthetic", [{"n": n} for n in range(5)])
    with Producer(settings) as other:
        fleet.start("worker", "--cpu")
        assert all(cancelled(other, request_id) for request_id in ids)
        assert other.infer("synthetic", [{"n": 99}]) == [{"echo": {"n": 99}}]
    assert executed(executions) == [99]


def test_cancelling_the_task_that_awaits_a_result_cancels_the_request(
    make_fleet: Callable[..., LocalFleet], tmp_path: Path
) -> None:
    fleet = ledger_fleet(make_fleet, tmp_path / "executions")
    settings = settings_for(fleet.env)
    keys = Keys(settings.key_prefix)

    async def abandon() -> str:
        client = aioredis.Redis.from_url(settings.redis_url.get_secret_value())
        async with AsyncProducer(settings, cancel_on_exit=True) as producer:
            request_id = await producer.submit("synthetic", {"n": 1})
            # No worker runs: only the cancel can end this wait, however slow the machine.
            waiting = asyncio.create_task(producer.result(request_id, timeout_s=3600))
            give_up = time.monotonic() + 60
            inbox = keys.inbox("synthetic", producer.producer_id)
            while not names_waiter(
                await client.get(keys.record("synthetic", request_id)), inbox
            ):  # the caller waits now
                assert time.monotonic() < give_up, "the caller never started waiting"
                await asyncio.sleep(0.01)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
        await client.aclose()
        return request_id

    request_id = asyncio.run(abandon())
    with Producer(settings) as producer:
        assert cancelled(producer, request_id)
