"""The whole path for real: producers, a batcher and Celery workers on a real redis-server."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from config.keys import Keys
from producer import async_client
from producer.async_client import AsyncProducer
from tests.script_slots import ScriptCalls
from workers.local.local_fleet import LocalFleet
from workers.models.synthetic import expected_output
from workers.runtime.cpu_core import spare_cores
from workers.runtime.gpu import gpu_count
from workers.runtime.timer_slack import WORKER_TIMER_SLACK_NS

from .conftest import check_outputs, producer_for, settings_for, wait_ready

# A blocking read that a closing producer must not wait out, and how long a close may take
# before it counts as waiting it out (far above a close's few milliseconds).
LONG_READ_S = 3600
CLOSE_BOUND_S = 60


def test_thousand_requests_through_producer_each_get_their_own_answer(
    make_fleet: Callable[..., LocalFleet],
) -> None:
    """1,000 requests via Producer all come back, each with the right value for its id; a bare
    `batchfleet worker` on a machine without GPUs runs one CPU worker and says so."""
    fleet = make_fleet()
    fleet.start("batcher")
    fleet.start("worker")
    with producer_for(fleet) as producer:
        wait_ready(producer, fleet)
        inputs = [{"n": index, "text": f"item {index}"} for index in range(1000)]
        ids = producer.submit_many("synthetic", inputs)
        results = {result.request_id: result for result in producer.results(ids, timeout_s=120)}
    check_outputs(
        {request_id: result.output for request_id, result in results.items()},
        {request_id: expected_output(value) for request_id, value in zip(ids, inputs, strict=True)},
    )
    sizes = {result.batch_id: result.batch_size for result in results.values()}
    assert sum(sizes.values()) / len(sizes) > 8, "requests should ride in real batches"
    if gpu_count() == 0:
        assert "no GPU found: starting one CPU worker" in fleet.logs()


def test_infer_returns_outputs_in_input_order(make_fleet: Callable[..., LocalFleet]) -> None:
    """infer() gathers results and lines them up with the inputs."""
    fleet = make_fleet()
    fleet.start("batcher")
    fleet.start("worker", "--cpu")
    with producer_for(fleet) as producer:
        wait_ready(producer, fleet)
        inputs = [f"sentence {index}" for index in range(100)]
        assert producer.infer("synthetic", inputs, timeout_s=60) == [
            expected_output(value) for value in inputs
        ]


def test_thousand_requests_through_async_producer(make_fleet: Callable[..., LocalFleet]) -> None:
    """1,000 requests via AsyncProducer, submitted concurrently, all get their own answer."""
    fleet = make_fleet()
    fleet.start("batcher")
    fleet.start("worker", "--cpu")
    settings = settings_for({k: v for k, v in fleet.env.items() if k.startswith("BATCHFLEET_")})

    async def scenario() -> dict[str, object]:
        async with AsyncProducer(settings) as producer:
            await producer.result(await producer.submit("synthetic", "warmup"), timeout_s=60)
            singles = await asyncio.gather(
                *(producer.submit("synthetic", {"n": index}) for index in range(500))
            )
            many = await producer.submit_many("synthetic", [{"n": i} for i in range(500, 1000)])
            ids = [*singles, *many]
            outputs = {
                result.request_id: result.output
                async for result in producer.results(ids, timeout_s=120)
            }
            assert await producer.infer("synthetic", ["x", "y"], timeout_s=30) == [
                expected_output("x"),
                expected_output("y"),
            ]
            return {"ids": ids, "outputs": outputs}

    outcome = asyncio.run(scenario())
    ids: list[str] = outcome["ids"]  # type: ignore[assignment]
    check_outputs(
        outcome["outputs"],  # type: ignore[arg-type]
        {request_id: expected_output({"n": index}) for index, request_id in enumerate(ids)},
    )


def test_an_async_producer_closes_without_waiting_out_its_inbox_read(
    make_fleet: Callable[..., LocalFleet], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Leaving ``async with AsyncProducer`` right after its last answer stops the inbox
    listener, which is then sending its next blocking read (here an hour long), instead of
    waiting for that read to end: on Python 3.11 redis-py's send, under ``asyncio.wait_for``,
    lets a cancellation that comes as it completes through."""
    monkeypatch.setattr(async_client, "LISTEN_BLOCK_S", LONG_READ_S)
    fleet = make_fleet()
    fleet.start("batcher")
    fleet.start("worker", "--cpu")
    env = {k: v for k, v in fleet.env.items() if k.startswith("BATCHFLEET_")}
    settings = settings_for({**env, "BATCHFLEET_REDIS_SOCKET_TIMEOUT_S": str(LONG_READ_S * 2)})

    async def scenario() -> tuple[list[object], bool]:
        producer = AsyncProducer(settings)
        outputs = await producer.infer("synthetic", ["x"], timeout_s=60)
        closing = asyncio.create_task(producer.aclose())
        closed, _ = await asyncio.wait([closing], timeout=CLOSE_BOUND_S)
        return outputs, closing in closed

    outputs, closed = asyncio.run(scenario())
    assert outputs == [expected_output("x")]
    assert closed, "closing the producer waited for its listener's blocking read to end"


def test_a_submit_needs_no_watch_call_even_when_its_answer_came_first(
    make_fleet: Callable[..., LocalFleet], script_calls: ScriptCalls
) -> None:
    """Producer.submit admits its request with the producer as its waiter: ``result`` reads
    no stored answer (no watch call), also when the answer reached the producer's inbox, and
    its listener took it, before ``result`` was called."""
    fleet = make_fleet()
    fleet.start("batcher")
    fleet.start("worker", "--cpu")
    store = redis.Redis.from_url(fleet.env["BATCHFLEET_REDIS_URL"])
    keys = Keys(fleet.env["BATCHFLEET_KEY_PREFIX"])
    with producer_for(fleet) as producer, store:
        wait_ready(producer, fleet)
        request_id = producer.submit("synthetic", "came first")
        inbox = keys.inbox("synthetic", producer.producer_id)
        deadline = time.monotonic() + 60
        while not store.exists(keys.result("synthetic", request_id)) or store.llen(inbox):
            assert time.monotonic() < deadline, "the answer was not pushed and taken"
            time.sleep(0.01)
        assert producer.result(request_id, timeout_s=30) == expected_output("came first")
    assert "admit" in script_calls.names() and "watch" not in script_calls.names()


def test_an_async_submit_needs_no_watch_call_even_when_its_answer_came_first(
    make_fleet: Callable[..., LocalFleet], script_calls: ScriptCalls
) -> None:
    """AsyncProducer.submit admits its request with the producer as its waiter: ``result``
    reads no stored answer (no watch call), also when the answer reached the producer's
    inbox, and its listener took it, before ``result`` was called."""
    fleet = make_fleet()
    fleet.start("batcher")
    fleet.start("worker", "--cpu")
    settings = settings_for({k: v for k, v in fleet.env.items() if k.startswith("BATCHFLEET_")})
    keys = Keys(settings.key_prefix)
    store = redis.Redis.from_url(settings.redis_url.get_secret_value())

    async def answered_first(producer: AsyncProducer, request_id: str) -> None:
        """Until the answer is written (its push with it) and taken from the inbox."""
        inbox = keys.inbox("synthetic", producer.producer_id)
        async with asyncio.timeout(60):
            while not store.exists(keys.result("synthetic", request_id)) or store.llen(inbox):
                await asyncio.sleep(0.01)

    async def scenario() -> list[object]:
        async with AsyncProducer(settings) as producer:
            await producer.result(await producer.submit("synthetic", "warmup"), timeout_s=60)
            request_id = await producer.submit("synthetic", "came first")
            await answered_first(producer, request_id)
            waited = await producer.result(request_id, timeout_s=30)
            concurrent = await asyncio.gather(*(waited_for(producer, {"n": n}) for n in range(100)))
            return [waited, *concurrent]

    try:
        outputs = asyncio.run(scenario())
    finally:
        store.close()
    expected = [expected_output("came first"), *(expected_output({"n": n}) for n in range(100))]
    assert outputs == expected
    assert "admit" in script_calls.names() and "watch" not in script_calls.names()


async def waited_for(producer: AsyncProducer, value: object) -> object:
    return await producer.result(await producer.submit("synthetic", value), timeout_s=60)


def test_a_prefork_worker_runs_batches_in_its_children(
    make_fleet: Callable[..., LocalFleet], redis_client: redis.Redis
) -> None:
    """With the prefork pool, batches run in Celery's child processes: every request gets its
    own answer, the parent tells batchers the worker and its two slots are there, and the
    children publish the worker's status."""
    fleet = make_fleet(BATCHFLEET_WORKER__POOL="prefork")
    fleet.start("batcher")
    fleet.start("worker", "--cpu", "--name", "forked@host")
    with producer_for(fleet) as producer:
        wait_ready(producer, fleet)
        inputs = [f"sentence {index}" for index in range(200)]
        assert producer.infer("synthetic", inputs, timeout_s=60) == [
            expected_output(value) for value in inputs
        ]
    keys = Keys(fleet.env["BATCHFLEET_KEY_PREFIX"])
    assert redis_client.zrange(keys.workers("synthetic"), 0, -1) == [b"forked@host|2"]
    assert redis_client.hget(keys.node("forked@host"), "models") == b"synthetic"


def test_two_workers_share_the_load(make_fleet: Callable[..., LocalFleet]) -> None:
    """With two workers up, both run batches of the same burst."""
    fleet = make_fleet()
    fleet.start("batcher")
    fleet.start("worker", "--cpu", "--name", "one@test")
    fleet.start("worker", "--cpu", "--name", "two@test")
    with producer_for(fleet) as producer:
        wait_ready(producer, fleet)
        ids = producer.submit_many("synthetic", list(range(1000)))
        results = list(producer.results(ids, timeout_s=120))
    assert len(results) == 1000 and all(result.ok for result in results)
    assert {result.worker for result in results} == {"one@test", "two@test"}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timer slack is Linux's")
def test_every_thread_of_a_worker_ends_its_timed_waits_on_time(
    make_fleet: Callable[..., LocalFleet],
) -> None:
    """A serving worker's threads (Celery's, the batches', the heartbeat) all have the
    worker's timer slack, not Linux's 50 µs default: a sub-millisecond wait of the device's
    hand-over ends when it is due."""
    fleet = make_fleet()
    fleet.start("batcher")
    worker = fleet.start("worker", "--cpu")
    with producer_for(fleet) as producer:
        wait_ready(producer, fleet)
        producer.infer("synthetic", list(range(100)), timeout_s=60)
        slacks = {}
        for tid in os.listdir(f"/proc/{worker.pid}/task"):
            with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
                slacks[tid] = Path(f"/proc/{tid}/timerslack_ns").read_text().strip()
    assert len(slacks) > 2 and set(slacks.values()) == {str(WORKER_TIMER_SLACK_NS)}, slacks


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="pinning to a core is Linux's")
def test_a_worker_given_a_core_runs_every_thread_on_it(
    make_fleet: Callable[..., LocalFleet],
) -> None:
    """``batchfleet worker --core N``: every thread of the serving worker (Celery's, the
    batches', the heartbeat) runs on core N alone, and it answers as an unpinned one does."""
    (core,) = spare_cores(1)
    fleet = make_fleet()
    fleet.start("batcher")
    worker = fleet.start("worker", "--cpu", "--core", str(core))
    with producer_for(fleet) as producer:
        wait_ready(producer, fleet)
        outputs = producer.infer("synthetic", list(range(100)), timeout_s=60)
        cores = {}
        for tid in os.listdir(f"/proc/{worker.pid}/task"):
            with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
                cores[tid] = os.sched_getaffinity(int(tid))
    assert outputs == [expected_output(value) for value in range(100)]
    assert len(cores) > 2 and all(on == {core} for on in cores.values()), cores


@pytest.mark.skipif(gpu_count() == 0, reason="needs an NVIDIA GPU (refused without one)")
def test_worker_pinned_to_a_gpu_is_named_after_it(make_fleet: Callable[..., LocalFleet]) -> None:
    """`batchfleet worker --gpu 0` runs as node gpu0@host and serves batches."""
    fleet = make_fleet()
    fleet.start("batcher")
    fleet.start("worker", "--gpu", "0")
    with producer_for(fleet) as producer:
        wait_ready(producer, fleet)
        (result,) = producer.results([producer.submit("synthetic", "x")], timeout_s=30)
    assert result.worker == f"gpu0@{socket.gethostname()}"
