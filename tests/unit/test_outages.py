"""Callers ride out Redis trouble up to their own timeouts (fakeredis, its server taken away
and given back, or a reply dropped after Redis acted on it)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import fakeredis
import pytest
import redis

from config import lua, stats_fields
from config.errors import BrokerUnavailable, ResultTimeout
from config.keys import Keys
from config.schema import Result
from config.settings import Settings
from producer.async_client import AsyncProducer
from producer.client import Producer
from tests.chaos.harness import wait_until
from tests.waiters import names_waiter
from workers.protocol.results import Answer, ResultWriter

KEYS = Keys("bf")
STREAM = KEYS.stream("synthetic")


def server_of(client: fakeredis.FakeRedis) -> fakeredis.FakeServer:
    return client.connection_pool.connection_kwargs["server"]


class Drops:
    """How many replies of command ``name`` are still to lose."""

    def __init__(self, name: str, drops: int) -> None:
        self.name = name
        self.drops = drops

    def after(self, commands: Sequence[Sequence[Any]]) -> None:
        """Called once ``commands`` ran on the server: loses their reply, while drops last,
        where one of them is ``name``."""
        if self.drops > 0 and any(str(args[0]).upper() == self.name for args in commands):
            self.drops -= 1
            raise redis.ConnectionError("Connection closed by server.")


def stack(pipe: Any) -> list[Sequence[Any]]:
    return [args for args, _ in pipe.command_stack]


class DropsReplies(fakeredis.FakeRedis):
    """A client on which the first ``drops`` calls of command ``name`` (alone, or in a
    pipeline) run on the server but lose their reply, as when a connection breaks after
    Redis acted."""

    def __init__(self, *args: Any, name: str, drops: int = 1, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lost = Drops(name, drops)

    @property
    def drops(self) -> int:
        return self.lost.drops

    def execute_command(self, *args: Any, **options: Any) -> Any:
        reply = super().execute_command(*args, **options)
        self.lost.after([args])
        return reply

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        pipe = super().pipeline(transaction, shard_hint)
        execute = pipe.execute

        def dropping(raise_on_error: bool = True) -> Any:
            commands = stack(pipe)
            reply = execute(raise_on_error)
            self.lost.after(commands)
            return reply

        pipe.execute = dropping
        return pipe


def answer(request_id: str) -> str:
    return Result(request_id=request_id, model="synthetic", output="out", finished_at=0).encode()


def test_submit_fails_fast_with_no_retry_budget(
    settings: Settings, fake_redis: fakeredis.FakeRedis
) -> None:
    """``submit_retry_s = 0``: Redis away is BrokerUnavailable at once, nothing enqueued."""
    settings = settings.model_copy(update={"submit_retry_s": 0})
    with Producer(settings, client=fake_redis) as producer:
        producer.policy("synthetic")  # the fleet's policies, read while Redis is there
        server_of(fake_redis).connected = False
        with pytest.raises(BrokerUnavailable):
            producer.submit("synthetic", 1)
        server_of(fake_redis).connected = True
    assert not fake_redis.exists(STREAM)


def test_submit_waits_for_redis_to_come_back(
    producer: Producer, fake_redis: fakeredis.FakeRedis
) -> None:
    """Redis away for a moment: ``submit`` tries again and returns the id, enqueued once."""
    server_of(fake_redis).connected = False
    threading.Timer(0.3, lambda: setattr(server_of(fake_redis), "connected", True)).start()
    request_id = producer.submit("synthetic", 1)
    assert fake_redis.xlen(STREAM) == 1
    assert fake_redis.exists(KEYS.record("synthetic", request_id))


def test_a_retried_admission_whose_reply_was_lost_enqueues_once(settings: Settings) -> None:
    """The admission ran but its reply was lost: the retry finds the same id with the same
    input already queued, and ``submit_many`` returns every id, each enqueued once."""
    server = fakeredis.FakeServer()
    client = DropsReplies(server=server, name="EVALSHA")
    with Producer(settings, client=client) as producer:
        ids = producer.submit_many("synthetic", [1, 2, 3])
    assert client.drops == 0
    assert len(ids) == 3
    assert client.xlen(STREAM) == 3


def test_a_wait_ends_at_its_own_timeout_naming_what_is_pending(
    producer: Producer, fake_redis: fakeredis.FakeRedis
) -> None:
    """Redis away for longer than the caller waits: ``ResultTimeout`` once the timeout has
    passed (not before), naming the pending id and the outage."""
    request_id = producer.submit("synthetic", 1)
    server_of(fake_redis).connected = False
    started = time.monotonic()
    with pytest.raises(ResultTimeout) as timeout:
        producer.result(request_id, timeout_s=1.0)
    assert time.monotonic() - started >= 1.0
    assert timeout.value.pending_ids == [request_id]
    assert "Redis could not be reached" in str(timeout.value)
    server_of(fake_redis).connected = True


def test_results_popped_with_a_lost_reply_are_read_from_where_they_are_stored(
    settings: Settings, fake_redis: fakeredis.FakeRedis
) -> None:
    """The listener pops a batch's answers from the inbox and the reply is lost: once it
    reaches Redis again, the waiting call reads the stored answers and misses none."""
    listen = DropsReplies(server=server_of(fake_redis), name="LPOP")
    with Producer(settings, client=fake_redis, listen_client=listen) as producer:
        ids = producer.submit_many("synthetic", [1, 2, 3])
        got: list[Result] = []
        waiter = threading.Thread(target=lambda: got.extend(producer.results(ids, timeout_s=30)))
        waiter.start()
        inbox = KEYS.inbox("synthetic", producer.producer_id)
        wait_until(
            lambda: all(
                names_waiter(fake_redis.get(KEYS.record("synthetic", i)), inbox) for i in ids
            )
        )
        for request_id in ids:  # as the finalize script writes a batch's answers
            fake_redis.set(KEYS.result("synthetic", request_id), answer(request_id))
        fake_redis.lpush(KEYS.inbox("synthetic", producer.producer_id), *(answer(i) for i in ids))
        waiter.join(timeout=30)
    assert listen.drops == 0
    assert sorted(result.request_id for result in got) == sorted(ids)


class AsyncDropsReplies(fakeredis.aioredis.FakeRedis):
    """``DropsReplies`` for an asyncio client."""

    def __init__(self, *args: Any, name: str, drops: int = 1, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lost = Drops(name, drops)

    @property
    def drops(self) -> int:
        return self.lost.drops

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        reply = await super().execute_command(*args, **options)
        self.lost.after([args])
        return reply

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        pipe = super().pipeline(transaction, shard_hint)
        execute = pipe.execute

        async def dropping(raise_on_error: bool = True) -> Any:
            commands = stack(pipe)
            reply = await execute(raise_on_error)
            self.lost.after(commands)
            return reply

        pipe.execute = dropping
        return pipe


def test_the_async_producer_reads_what_a_lost_reply_popped(settings: Settings) -> None:
    """``AsyncProducer`` as ``Producer``: answers popped by a reply that was lost are read
    where they are stored, and a retried admission enqueues once."""
    server = fakeredis.FakeServer()
    client = AsyncDropsReplies(server=server, name="EVALSHA")
    listen = AsyncDropsReplies(server=server, name="LPOP")

    async def scenario() -> tuple[list[str], list[str], int]:
        async with AsyncProducer(settings, client=client, listen_client=listen) as producer:
            ids = await producer.submit_many("synthetic", [1, 2, 3])
            waiting = asyncio.create_task(collect(producer.results(ids, timeout_s=30)))
            inbox = KEYS.inbox("synthetic", producer.producer_id)
            records = [KEYS.record("synthetic", i) for i in ids]
            while not all([names_waiter(await client.get(r), inbox) for r in records]):
                await asyncio.sleep(0.01)
            for request_id in ids:
                await client.set(KEYS.result("synthetic", request_id), answer(request_id))
            await client.lpush(
                KEYS.inbox("synthetic", producer.producer_id), *(answer(i) for i in ids)
            )
            return ids, await waiting, await client.xlen(STREAM)

    ids, got, queued = asyncio.run(scenario())
    assert sorted(got) == sorted(ids)
    assert queued == 3
    assert client.drops == 0 and listen.drops == 0


async def collect(results: AsyncIterator[Result]) -> list[str]:
    return [result.request_id async for result in results]


def test_an_async_wait_ends_at_its_own_timeout_naming_what_is_pending(settings: Settings) -> None:
    """``AsyncProducer`` as ``Producer``: Redis away past the timeout is ``ResultTimeout``
    naming the pending id."""
    server = fakeredis.FakeServer()
    client = fakeredis.aioredis.FakeRedis(server=server)

    async def scenario() -> ResultTimeout:
        async with AsyncProducer(settings, client=client, listen_client=client) as producer:
            request_id = await producer.submit("synthetic", 1)
            server.connected = False
            try:
                await producer.result(request_id, timeout_s=1.0)
            except ResultTimeout as timeout:
                assert timeout.pending_ids == [request_id]
                return timeout
            finally:
                server.connected = True
        raise AssertionError("the wait did not time out")

    assert "Redis could not be reached" in str(asyncio.run(scenario()))


def test_a_finalize_whose_reply_was_lost_writes_its_answer_once(
    fake_redis: fakeredis.FakeRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker's finalize goes out past redis-py's retries (``lua.call``). Its reply lost
    with the connection after Redis wrote the answer, the call goes again through the
    client, which finds it written: the request keeps its one answer, counted once."""
    fake_redis.script_load(lua.source("finalize"))
    pool = fake_redis.connection_pool
    get_connection = pool.get_connection
    lost: list[Any] = []

    def first_loses_its_reply(*args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(pool, "get_connection", get_connection)
        connection = get_connection(*args, **kwargs)
        read = connection.read_response

        def lose(*read_args: Any, **read_kwargs: Any) -> Any:
            lost.append(read(*read_args, **read_kwargs))
            del connection.read_response
            raise redis.ConnectionError("Connection closed by server.")

        connection.read_response = lose
        return connection

    monkeypatch.setattr(pool, "get_connection", first_loses_its_reply)
    result = Result(request_id="r-1", model="synthetic", output=2, finished_at=0)
    answer = Answer.of("", result, digest="", ttl_s=60)
    assert ResultWriter(fake_redis, KEYS, "synthetic").finalize([answer]) == ["duplicate"]
    assert lost == [[b"written"]]
    assert Result.decode(fake_redis.get(KEYS.result("synthetic", "r-1"))).output == 2
    completed = fake_redis.hget(KEYS.stats("synthetic"), stats_fields.COMPLETED)
    assert completed == b"1"
