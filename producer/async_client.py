"""``AsyncProducer``: the asyncio twin of ``Producer``, with the same method names."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable, Sequence
from time import monotonic
from types import TracebackType
from typing import Any

import redis
import redis.asyncio as aioredis

from config import lua
from config.connection import REDIS_RETRY_PAUSE_S, broker_errors
from config.errors import (
    BatchfleetError,
    BrokerUnavailable,
    RequestRejected,
    ResultTimeout,
    UnknownRequest,
)
from config.schema import Result
from config.settings import ModelPolicy, Settings, load_settings
from producer.admission import (
    INBOX_DRAIN,
    RECORD_CHANGED,
    Prepared,
    ProducerCore,
    StreamReader,
    chunks,
    read_inbox,
)
from producer.client import LISTEN_BLOCK_S
from producer.turn_batches import TurnBatch
from producer.waiters import ResultQueue, Waiters

MAX_CONNECTIONS = 32


def connect_async(settings: Settings) -> aioredis.Redis:
    """An asyncio redis-py client for ``settings``: bounded socket timeouts, and at most
    32 connections, for which concurrent calls queue instead of failing."""
    pool = aioredis.BlockingConnectionPool.from_url(
        settings.redis_url.get_secret_value(),
        max_connections=MAX_CONNECTIONS,
        timeout=settings.redis_socket_timeout_s,
        socket_timeout=settings.redis_socket_timeout_s,
        socket_connect_timeout=settings.redis_socket_timeout_s,
        health_check_interval=30,
    )
    return aioredis.Redis.from_pool(pool)


class AsyncInboxListener:
    """One task, one blocking read: hands each result pushed to the inbox to its waiters."""

    def __init__(self, client: aioredis.Redis, inbox: str) -> None:
        self._client = client
        self._inbox = inbox
        self._waiters = Waiters()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    def expect(self, request_ids: Iterable[str], queue: ResultQueue) -> None:
        """Puts each of ``request_ids``' results in ``queue`` when it arrives (or the error
        that ends the wait); the listener runs on the caller's loop."""
        self._waiters.add(request_ids, queue)
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="batchfleet-inbox")

    def forget(self, request_ids: Iterable[str], queue: ResultQueue) -> None:
        self._waiters.remove(request_ids, queue)

    async def aclose(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._client.aclose()

    async def _run(self) -> None:
        while not self._closed:
            try:
                item = await self._client.blpop([self._inbox], timeout=LISTEN_BLOCK_S)
            except redis.RedisError as exc:
                self._waiters.fail_all(BrokerUnavailable(f"Redis is unavailable: {exc}"))
                await asyncio.sleep(REDIS_RETRY_PAUSE_S)
                continue
            if item is None:
                continue
            try:  # a batch finalizes many results at once: take them in one more round trip
                rest = await self._client.lpop(self._inbox, INBOX_DRAIN) or []
            except redis.RedisError as exc:
                # Redis may have popped results this reply lost: their waiters must not wait
                # in vain. They get a typed error; asking again finds the stored results.
                self._waiters.deliver(read_inbox([item[1]]))
                self._waiters.fail_all(BrokerUnavailable(f"Redis is unavailable: {exc}"))
                continue
            self._waiters.deliver(read_inbox([item[1], *rest]))


class AsyncProducer:
    """Submits requests to the fleet and awaits their results.

    Example::

        async with AsyncProducer() as producer:
            outputs = await producer.infer("synthetic", ["a", "b", "c"])
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        client: aioredis.Redis | None = None,
        listen_client: aioredis.Redis | None = None,
        producer_id: str | None = None,
        cancel_on_exit: bool = False,
    ) -> None:
        self._core = ProducerCore(settings or load_settings(), producer_id, cancel_on_exit)
        self._client = client or connect_async(self._core.settings)
        self._admit = lua.register(self._client, "admit")
        self._watch = lua.register(self._client, "watch")
        self._cancel = lua.register(self._client, "cancel")
        self._stream_admit = lua.register(self._client, "stream_admit")
        self._listener = AsyncInboxListener(
            listen_client or connect_async(self._core.settings), self._core.inbox
        )
        # Single submits and waits of many coroutines, one round trip per loop turn.
        self._admit_one: TurnBatch[Prepared, str | bytes] = TurnBatch(self._admit_one_by_one)
        self._watch_ids: TurnBatch[Sequence[str], list[Result | None]] = TurnBatch(
            self._watch_together
        )

    @property
    def producer_id(self) -> str:
        return self._core.producer_id

    async def submit(
        self,
        model: str,
        input: Any,
        *,
        request_id: str | None = None,
        deadline_s: float | None = None,
        priority: str = "normal",
    ) -> str:
        """Enqueues one request and returns its id; see ``Producer.submit``."""
        ids = None if request_id is None else [request_id]
        (prepared,) = await self._prepare(
            model, [input], request_ids=ids, deadline_s=deadline_s, priority=priority
        )
        reply = await self._admit_one(prepared)
        self._core.check_admission(prepared, reply)
        self._core.submitted([prepared.request_id])
        return prepared.request_id

    async def _admit_one_by_one(self, items: list[Prepared]) -> list[str | bytes]:
        """The admission statuses of single submits made on one loop turn, each admitted as
        if alone (``admit.lua`` one by one)."""
        statuses: list[str | bytes] = [""] * len(items)
        for group in self._core.one_by_one_groups(items):
            keys, args = self._core.admit_call([items[n] for n in group], one_by_one=True)
            with broker_errors():
                replies = await self._admit(keys=keys, args=args)
            for n, status in zip(group, replies, strict=True):
                statuses[n] = status
        return statuses

    async def _watch_together(
        self, batches: list[Sequence[str]]
    ) -> list[list[Result | None] | BaseException]:
        """For each caller's ids (asked on one loop turn), what ``read_watch`` reads: one
        watch call for them all, or one per ``submit_chunk`` ids."""
        ids = [request_id for batch in batches for request_id in batch]
        reply: list[Any] = []
        for chunk in chunks(ids, self._core.settings.submit_chunk):
            keys, args = self._core.watch_call(chunk)
            with broker_errors():
                reply += await self._watch(keys=keys, args=args)
        outcomes: list[list[Result | None] | BaseException] = []
        start = 0
        for batch in batches:
            try:
                outcomes.append(self._core.read_watch(batch, reply[start : start + len(batch)]))
            except UnknownRequest as unknown:
                outcomes.append(unknown)
            start += len(batch)
        return outcomes

    async def submit_many(
        self,
        model: str,
        inputs: Iterable[Any],
        *,
        request_ids: Sequence[str] | None = None,
        deadline_s: float | None = None,
        priority: str = "normal",
    ) -> list[str]:
        """Enqueues many requests, one round trip per chunk; see ``Producer.submit_many``."""
        prepared = await self._prepare(
            model, inputs, request_ids=request_ids, deadline_s=deadline_s, priority=priority
        )
        accepted: list[str] = []
        for chunk in self._core.admission_chunks(prepared):
            keys, args = self._core.admit_call(chunk)
            with broker_errors():
                replies = await self._admit(keys=keys, args=args)
            try:
                ids = self._core.check_chunk(chunk, replies)
            except RequestRejected as refusal:
                refusal.accepted_ids = accepted
                raise
            self._core.submitted(ids)
            accepted.extend(ids)
        return accepted

    async def _follow_fleet(self) -> None:
        """Reads the fleet's model policies when they are due (every few seconds)."""
        if self._core.fleet.due(monotonic()):
            with broker_errors():
                published = await self._client.hgetall(self._core.keys.policies())
            self._core.fleet.adopt(published, monotonic())

    async def policy(self, model: str) -> ModelPolicy:
        """The policy the fleet serves ``model`` with (its batchers', else this producer's
        configuration): queue cap, input size, deadline, priorities, response cache.

        Raises:
            UnknownModel: neither the fleet nor this producer's configuration serves it.
            BrokerUnavailable: Redis cannot be reached.
        """
        await self._follow_fleet()
        return self._core.policy(model)

    async def _prepare(self, model: str, inputs: Iterable[Any], **options: Any) -> list[Prepared]:
        """Validates every input (``ProducerCore.prepare_all``) by the fleet's policies; a
        refusal is counted in the model's stats, best effort."""
        await self._follow_fleet()
        try:
            return self._core.prepare_all(model, inputs, **options)
        except RequestRejected as refusal:
            counter = self._core.refusal_count(model, refusal)
            if counter is not None:
                with contextlib.suppress(redis.RedisError):
                    await self._client.hincrby(*counter, 1)
            raise

    async def validate(self, model: str, input: Any) -> None:
        """Checks, without enqueuing, that ``input`` would be accepted for ``model``; see
        ``Producer.validate``."""
        await self._follow_fleet()
        self._core.prepare(model, input)

    async def result(self, request_id: str, timeout_s: float | None = None) -> Any:
        """Awaits one request's output; see ``Producer.result``."""
        async for result in self.results([request_id], timeout_s=timeout_s):
            return result.unwrap()
        raise ResultTimeout(f"no result for {request_id!r}")

    async def results(
        self, request_ids: Sequence[str], timeout_s: float | None = None
    ) -> AsyncIterator[Result]:
        """Yields each request's final ``Result`` as it completes; see ``Producer.results``.
        With ``cancel_on_exit``, cancelling the task that waits cancels the requests it was
        still waiting for."""
        waiting = set(request_ids)
        try:
            async for result in self._results(request_ids, timeout_s):
                waiting.discard(result.request_id)
                self._core.answered(result.request_id)
                yield result
        except asyncio.CancelledError:
            if self._core.cancel_on_exit:
                await asyncio.shield(self._cancel_quietly(sorted(waiting)))
            raise

    async def stream(
        self,
        model: str,
        input: Any,
        *,
        request_id: str | None = None,
        deadline_s: float | None = None,
    ) -> AsyncIterator[dict[str, Any]]:
        """Streams one request's chunks as they come (``async for chunk in
        producer.stream(...)``); see ``Producer.stream``. Leaving the loop early, or
        cancelling the task, cancels the request."""
        ids = None if request_id is None else [request_id]
        (prepared,) = await self._prepare(model, [input], request_ids=ids, deadline_s=deadline_s)
        keys, args = self._core.stream_call(prepared)
        with broker_errors():
            admitted = await self._stream_admit(keys=keys, args=args)
        self._core.check_admission(prepared, admitted)
        request_id, deadline_at = prepared.request_id, prepared.request.deadline_at
        reader = StreamReader(self._core.keys, request_id, deadline_at)
        try:
            while not reader.finished:
                block_ms = reader.block_ms()
                with broker_errors():
                    streams: dict[Any, Any] = {reader.key: reader.last}
                    reply = await self._client.xread(streams, count=100, block=block_ms)
                    # Nothing came: answered without a last chunk for us (cancelled)?
                    raw = None if reply else await self._client.get(reader.result_key)
                for chunk in reader.chunks(reply):
                    yield chunk
                ended = reader.ended(raw)
                if ended is not None:
                    yield ended
        finally:
            if not reader.finished:
                await asyncio.shield(self._cancel_quietly([request_id]))

    async def cancel(self, request_id: str) -> bool:
        """Cancels a request; see ``Producer.cancel``."""
        record_key = self._core.keys.record(request_id)
        with broker_errors():
            status = RECORD_CHANGED
            while status == RECORD_CHANGED:
                record = await self._client.get(record_key)
                keys, args = self._core.cancel_call(request_id, record)
                status = self._core.cancel_status(await self._cancel(keys=keys, args=args))
        self._core.answered(request_id)
        return self._core.read_cancel(request_id, status)

    async def _cancel_quietly(self, request_ids: Sequence[str]) -> None:
        """Cancels each of ``request_ids``, best effort (a close or a cancellation goes on)."""
        for request_id in request_ids:
            with contextlib.suppress(BatchfleetError):
                await self.cancel(request_id)

    async def _results(
        self, request_ids: Sequence[str], timeout_s: float | None
    ) -> AsyncIterator[Result]:
        if timeout_s is None:
            timeout_s = self._core.default_timeout_s()
        deadline = monotonic() + timeout_s
        ids = list(dict.fromkeys(request_ids))
        arrived: asyncio.Queue[Result | BaseException] = asyncio.Queue()
        self._listener.expect(ids, arrived)
        try:
            waiting: set[str] = set()
            for batch in chunks(ids, self._core.settings.submit_chunk):
                read = await self._watch_ids(batch)
                for request_id, result in zip(batch, read, strict=True):
                    if result is None:
                        waiting.add(request_id)
                    else:
                        yield result
            while waiting:
                try:
                    async with asyncio.timeout(max(deadline - monotonic(), 0)):
                        item = await arrived.get()
                except TimeoutError:
                    raise ResultTimeout(
                        f"{len(waiting)} of {len(ids)} results did not come in time"
                    ) from None
                if isinstance(item, BaseException):
                    raise item
                if item.request_id in waiting:
                    waiting.discard(item.request_id)
                    yield item
        finally:
            self._listener.forget(ids, arrived)

    async def infer(
        self,
        model: str,
        inputs: Sequence[Any],
        timeout_s: float | None = None,
        *,
        deadline_s: float | None = None,
    ) -> list[Any]:
        """Submits ``inputs`` and returns their outputs in input order; see ``Producer.infer``."""
        ids = await self.submit_many(model, inputs, deadline_s=deadline_s)
        by_id = {
            result.request_id: result async for result in self.results(ids, timeout_s=timeout_s)
        }
        return [by_id[request_id].unwrap() for request_id in ids]

    async def aclose(self) -> None:
        """Cancels what it still waits for (with ``cancel_on_exit``), stops the inbox
        listener and releases connections."""
        await self._cancel_quietly(self._core.outstanding())
        await self._listener.aclose()
        with contextlib.suppress(redis.RedisError):
            await self._client.delete(self._core.inbox)
        await self._client.aclose()

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
