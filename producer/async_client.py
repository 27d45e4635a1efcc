"""``AsyncProducer``: the asyncio twin of ``Producer``, with the same method names."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Iterable,
    Sequence,
)
from functools import partial
from time import monotonic
from types import TracebackType
from typing import Any, cast

import redis
import redis.asyncio as aioredis
import redis.asyncio.cluster
import redis.asyncio.sentinel
from redis.asyncio.client import Pipeline as AsyncPipeline
from redis.commands.core import AsyncScript

from config import lua
from config.connection import broker_errors, client_options, is_outage
from config.errors import (
    BatchfleetError,
    BrokerUnavailable,
    RedisAccessDenied,
    RequestRejected,
    UnknownRequest,
)
from config.hiredis_packing import pack_with_hiredis
from config.replica_wait import ReplicaWait
from config.schema import Result
from config.sentinel import AsyncMasterFollowingPool, sentinel_group
from config.settings import ModelPolicy, Settings, load_settings
from producer.admission import (
    RECORD_CHANGED,
    CheckedInputs,
    Prepared,
    ProducerCore,
    StreamReader,
    chunks,
    inbox_taken,
    queue_inbox_take,
    read_inbox,
)
from producer.client import LISTEN_BLOCK_S
from producer.outages import Backoff, call_until_async, single_try_async
from producer.turn_batches import TurnBatch
from producer.waiters import (
    AsyncArrivals,
    DeadlineTicks,
    InboxWaits,
    Reconnected,
    ResultWait,
)

MAX_CONNECTIONS = 32
# How often a listener being stopped is cancelled again while it runs on (``stop_listening``).
RECANCEL_S = 0.01


def connect_async(settings: Settings) -> aioredis.Redis:
    """An asyncio redis-py client for ``settings``: bounded socket timeouts, no retries of
    its own (the producer retries by deadline; a cluster's client keeps its own) and, on one
    Redis, at most 32 connections, for which concurrent calls queue instead of failing.
    Outside a cluster (whose client builds its nodes' connections itself), commands are
    packed by hiredis (``config.hiredis_packing``)."""
    options = client_options(settings, single_try_async())
    if settings.redis_cluster:
        options.pop("retry")  # the cluster client's own retries follow slots that moved
        cluster = aioredis.cluster.RedisCluster.from_url(
            settings.redis_url.get_secret_value(), **options
        )
        return cast(aioredis.Redis, cluster)
    if settings.redis_sentinel_master:
        sentinels = sentinel_group(settings, aioredis.sentinel.Sentinel)
        master = sentinels.master_for(
            settings.redis_sentinel_master,
            connection_pool_class=AsyncMasterFollowingPool,
            **options,
        )
        pack_with_hiredis(master.connection_pool)
        return cast(aioredis.Redis, master)
    pool = aioredis.BlockingConnectionPool.from_url(
        settings.redis_url.get_secret_value(),
        max_connections=MAX_CONNECTIONS,
        timeout=settings.redis_socket_timeout_s,
        **options,
    )
    pack_with_hiredis(pool)
    return aioredis.Redis.from_pool(pool)


class AsyncInboxListener(InboxWaits):
    """One task and one blocking read per model's inbox, on the caller's loop: hands each
    result pushed there to its waiters."""

    def __init__(self, client: aioredis.Redis, inbox: Callable[[str], str]) -> None:
        super().__init__()
        self._client = client
        self._inbox = inbox
        self._tasks: dict[str, asyncio.Task[None]] = {}  # by model
        self._closed = False

    def _listen(self, model: str) -> None:
        if model not in self._tasks:
            inbox = self._inbox(model)
            self._tasks[model] = asyncio.create_task(self._run(inbox), name="batchfleet-inbox")

    async def aclose(self) -> None:
        """Stops the listening tasks and deletes their inboxes."""
        self._closed = True
        for model, task in self._tasks.items():
            await stop_listening(task)
            with contextlib.suppress(redis.RedisError):
                await self._client.delete(self._inbox(model))
        await self._client.aclose()

    async def _run(self, inbox: str) -> None:
        away: Backoff | None = None  # set while Redis cannot be reached
        while not self._closed:
            try:
                if away is not None:
                    await self._client.ping()
                    away = None
                    self._waiters.reconnected()
                # As ``InboxListener``: results a lost reply popped are read where they are
                # stored once Redis is back.
                pipe = self._client.pipeline(transaction=False)
                queue_inbox_take(pipe, inbox, LISTEN_BLOCK_S)
                popped = inbox_taken(await pipe.execute())
            except redis.RedisError as exc:
                if not is_outage(exc):
                    self._waiters.fail_all(RedisAccessDenied(f"Redis refused the inbox: {exc}"))
                away = away or Backoff()
                await asyncio.sleep(away.next_pause_s())
                continue
            if popped:
                self._waiters.deliver(read_inbox(popped))
                # The callers just woken run before the next read is sent: sending it first
                # kept each answer from its caller ~0.15 ms longer (benchmarks/README.md).
                await asyncio.sleep(0)


async def stop_listening(task: asyncio.Task[None]) -> None:
    """Cancels a listener's ``task`` and waits for its end, cancelling it again every
    ``RECANCEL_S`` while it runs on. On Python 3.11 ``asyncio.wait_for``, under which redis-py
    sends every command, drops a cancellation that comes in the loop turn the send completes
    (python/cpython#86296, fixed in 3.12): the listener went on into its blocking read, and a
    producer closed right after its last answer waited out that read (a second). A close that
    is itself cancelled stays cancelled: only the listener's own cancellation is kept quiet."""
    while not task.done():
        task.cancel()
        await asyncio.wait([task], timeout=RECANCEL_S)
    with contextlib.suppress(asyncio.CancelledError):
        task.result()


class AsyncWaiting:
    """The wait of one ``result``, ``results`` or ``infer`` call of an ``AsyncProducer``, as
    an async context: its ``ResultWait`` and the queue its answers arrive in. Leaving it
    forgets the wait; leaving it cancelled first cancels, with ``cancel`` (given for
    ``cancel_on_exit``), the requests it still waited for."""

    def __init__(
        self,
        wait: ResultWait,
        arrived: AsyncArrivals,
        listener: AsyncInboxListener,
        cancel: Callable[[Sequence[str]], Awaitable[None]] | None,
    ) -> None:
        self.wait = wait
        self.arrived = arrived
        self._listener = listener
        self._cancel = cancel

    async def __aenter__(self) -> AsyncWaiting:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            cancelled = exc_type is not None and issubclass(exc_type, asyncio.CancelledError)
            if cancelled and self._cancel is not None:
                await asyncio.shield(self._cancel(sorted(self.wait.waiting)))
        finally:
            self._listener.forget(self.wait.ids, self.arrived)


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
        self._claim = lua.register(self._client, "claim_request_id")
        self._admit = lua.register(self._client, "admit")
        self._watch = lua.register(self._client, "watch")
        self._cancel = lua.register(self._client, "cancel")
        self._stream_admit = lua.register(self._client, "stream_admit")
        self._replica_wait = ReplicaWait.of(self._core.settings)
        self._listener = AsyncInboxListener(
            listen_client or connect_async(self._core.settings), self._core.inbox
        )
        self._deadlines = DeadlineTicks()
        # Single submits and waits of many coroutines, one round trip per loop turn.
        self._admit_one: TurnBatch[Prepared, str | bytes] = TurnBatch(self._admit_one_by_one)
        self._watch_ids: TurnBatch[tuple[str, Sequence[str]], list[Result | None]] = TurnBatch(
            self._watch_together
        )

    @property
    def producer_id(self) -> str:
        return self._core.producer_id

    async def _admitted(
        self,
        script: AsyncScript,
        items: Sequence[Prepared],
        call: Callable[[Sequence[Prepared]], tuple[list[Any], list[Any]]],
    ) -> list[Any]:
        """Each of ``items``' admission status; see ``Producer._admitted``."""
        admit = partial(self._admit_now, script, items, call, False)
        return await call_until_async(self._core.submit_deadline(), admit)

    async def _admit_now(
        self,
        script: AsyncScript,
        items: Sequence[Prepared],
        call: Callable[[Sequence[Prepared]], tuple[list[Any], list[Any]]],
        one_by_one: bool,
    ) -> list[Any]:
        """``_admitted``, tried once; see ``Producer._admit_now``."""
        owners: dict[str, Any] = {}
        if any(item.callers_id for item in items):
            claims = partial(self._core.queue_claims, items=items, script=self._claim)
            replies = await lua.execute_async(self._client, claims, [self._claim])
            owners = self._core.claim_owners(items, replies)
        admissible, statuses = self._core.after_claims(items, owners, one_by_one)
        refused = self._core.claim_refusals(items, statuses)
        if refused is not None:
            with contextlib.suppress(redis.RedisError):  # best effort: the refusal stands
                await self._client.hincrby(*refused)
        if not admissible:
            return statuses
        admission = partial(
            self._core.queue_admission,
            script=script,
            call=call(admissible),
            replica_wait=self._replica_wait,
        )
        replies = await lua.execute_async(self._client, admission, [script])
        return self._core.admission_statuses(statuses, replies, self._replica_wait)

    async def submit(
        self,
        model: str,
        input: Any,
        *,
        request_id: str | None = None,
        deadline_s: float | None = None,
        priority: str = "normal",
    ) -> str:
        """Enqueues one request and returns its id; see ``Producer.submit`` (this producer
        becomes its waiter)."""
        ids = None if request_id is None else [request_id]
        checked = await self._check(
            model, [input], request_ids=ids, deadline_s=deadline_s, priority=priority
        )
        (prepared,) = self._core.build(checked)
        self._listener.hold(model, [prepared.request_id])
        reply: str | bytes = ""
        try:
            reply = await call_until_async(
                self._core.submit_deadline(), partial(self._admit_one, prepared)
            )
            self._core.check_admission(prepared, reply)
        finally:
            if not self._core.enqueued([prepared], [reply]):
                self._listener.release([prepared.request_id])
        self._core.submitted(model, [prepared.request_id])
        return prepared.request_id

    async def _admit_one_by_one(self, items: list[Prepared]) -> list[str | bytes]:
        """The admission statuses of single submits made on one loop turn, each admitted as
        if alone (``admit.lua`` one by one), with this producer as its waiter."""
        statuses: list[str | bytes] = [""] * len(items)
        one_by_one = partial(self._core.admit_call, one_by_one=True, waiting=True)
        for group in self._core.one_by_one_groups(items):
            with broker_errors():
                replies = await self._admit_now(
                    self._admit, [items[n] for n in group], one_by_one, True
                )
            for n, status in zip(group, replies, strict=True):
                statuses[n] = status
        return statuses

    async def _watch_together(
        self, batches: list[tuple[str, Sequence[str]]]
    ) -> list[list[Result | None] | BaseException]:
        """For each caller's ids of one model (asked on one loop turn), what ``read_watch``
        reads: one watch call per model for them all, or one per ``submit_chunk`` ids."""
        by_model: dict[str, list[str]] = {}
        for model, batch in batches:
            by_model.setdefault(model, []).extend(batch)
        replies: dict[tuple[str, str], Any] = {}
        for model, ids in by_model.items():
            for chunk in chunks(ids, self._core.settings.submit_chunk):
                keys, args = self._core.watch_call(model, chunk)
                with broker_errors():
                    reply = await self._watch(keys=keys, args=args)
                replies.update(
                    ((model, request_id), r) for request_id, r in zip(chunk, reply, strict=True)
                )
        outcomes: list[list[Result | None] | BaseException] = []
        for model, batch in batches:
            try:
                read = [replies[model, request_id] for request_id in batch]
                outcomes.append(self._core.read_watch(batch, read))
            except UnknownRequest as unknown:
                outcomes.append(unknown)
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
        checked = await self._check(
            model, inputs, request_ids=request_ids, deadline_s=deadline_s, priority=priority
        )
        await self._enqueue(model, checked)
        return checked.request_ids

    async def _enqueue(self, model: str, checked: CheckedInputs, waiting: bool = False) -> set[str]:
        """Admits ``checked`` chunk by chunk; see ``Producer._enqueue``."""
        accepted: list[str] = []
        enqueued: set[str] = set()
        call = partial(self._core.admit_call, waiting=waiting)
        for chunk in self._core.admission_chunks(checked):
            try:
                replies = await self._admitted(self._admit, chunk, call)
                ids = self._core.check_chunk(chunk, replies)
            except (RequestRejected, BrokerUnavailable) as refusal:
                refusal.accepted_ids = accepted
                raise
            self._core.submitted(model, ids)
            accepted.extend(ids)
            if waiting:
                enqueued |= self._core.enqueued(chunk, replies)
        return enqueued

    async def _follow_fleet(self, deadline: float | None = None) -> None:
        """Reads the fleet's model policies when they are due (every few seconds): the first
        time trying until ``deadline`` (``submit_retry_s`` from now) while Redis cannot be
        reached, later once, keeping the last ones read when that fails."""
        fleet = self._core.fleet
        if not fleet.due(monotonic()):
            return
        read = partial(self._client.hgetall, self._core.keys.policies())
        if not fleet.followed():
            published = await call_until_async(deadline or self._core.submit_deadline(), read)
        else:
            try:
                published = await call_until_async(monotonic(), read)  # one try
            except BrokerUnavailable:
                fleet.postpone(monotonic())
                return
        fleet.adopt(published, monotonic())

    async def models(self) -> list[str]:
        """The models this producer serves: the fleet's (every model a batcher published),
        and those only its own configuration names.

        Raises:
            BrokerUnavailable: Redis cannot be reached.
        """
        await self._follow_fleet()
        return sorted(self._core.fleet.models)

    async def policy(self, model: str) -> ModelPolicy:
        """The policy the fleet serves ``model`` with (its batchers', else this producer's
        configuration): queue cap, input size, deadline, priorities, response cache.

        Raises:
            UnknownModel: neither the fleet nor this producer's configuration serves it.
            BrokerUnavailable: Redis cannot be reached.
        """
        await self._follow_fleet()
        return self._core.policy(model)

    async def _check(self, model: str, inputs: Iterable[Any], **options: Any) -> CheckedInputs:
        """Validates every input (``ProducerCore.check_all``) by the fleet's policies; a
        refusal is counted in the model's stats, best effort."""
        await self._follow_fleet()
        try:
            return self._core.check_all(model, inputs, **options)
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
        return (await self._collected([request_id], timeout_s))[request_id].unwrap()

    async def results(
        self, request_ids: Sequence[str], timeout_s: float | None = None
    ) -> AsyncGenerator[Result, None]:
        """Yields each request's final ``Result`` as it completes; see ``Producer.results``.
        With ``cancel_on_exit``, cancelling the task that waits cancels the requests it was
        still waiting for.

        A loop left early leaves the generator to asyncio, which closes it in a task of its
        own; ``contextlib.aclosing`` around it closes it in place."""
        async with self._waiting(request_ids, timeout_s) as waiting:
            answered = await self._first_answers(waiting)
            while True:
                for result in answered:
                    yield result
                if not waiting.wait.waiting:
                    return
                answered = await self._arrived(waiting)

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
        checked = await self._check(model, [input], request_ids=ids, deadline_s=deadline_s)
        (prepared,) = self._core.build(checked)
        (admitted,) = await self._admitted(self._stream_admit, [prepared], self._core.stream_call)
        self._core.check_admission(prepared, admitted)
        self._core.remember(model, [prepared.request_id])
        request_id, deadline_at = prepared.request_id, prepared.request.deadline_at
        reader = StreamReader(self._core.keys, model, request_id, deadline_at)
        away: Backoff | None = None  # set while Redis cannot be reached
        try:
            while not reader.finished:
                block_ms = reader.block_ms()
                try:
                    with broker_errors():
                        streams: dict[Any, Any] = {reader.key: reader.last}
                        reply = await self._client.xread(streams, count=100, block=block_ms)
                        # Nothing came: answered without a last chunk for us (cancelled)?
                        raw = None if reply else await self._client.get(reader.result_key)
                except BrokerUnavailable:
                    away = away or Backoff()
                    await asyncio.sleep(away.next_pause_s())
                    continue
                if away is not None:
                    away = None
                    reader.reconnected()
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
        model = (await self._models_of([request_id], deadline=monotonic()))[request_id]
        record_key = self._core.keys.record(model, request_id)
        with broker_errors():
            status = RECORD_CHANGED
            while status == RECORD_CHANGED:
                record = await self._client.get(record_key)
                keys, args = self._core.cancel_call(model, request_id, record)
                status = self._core.cancel_status(await self._cancel(keys=keys, args=args))
        self._core.answered(request_id)
        return self._core.read_cancel(request_id, status)

    async def _cancel_quietly(self, request_ids: Sequence[str]) -> None:
        """Cancels each of ``request_ids``, best effort (a close or a cancellation goes on)."""
        for request_id in request_ids:
            with contextlib.suppress(BatchfleetError):
                await self.cancel(request_id)

    async def _collected(
        self,
        request_ids: Sequence[str],
        timeout_s: float | None,
        admission: Callable[[], Awaitable[set[str]]] | None = None,
    ) -> dict[str, Result]:
        """Every result of ``request_ids`` by id, once all came: what ``results`` yields,
        without a generator (the wait of ``result`` and ``infer``); with ``admission``, as
        ``Producer._results``."""
        async with self._waiting(request_ids, timeout_s) as waiting:
            answered = await self._first_answers(waiting, admission)
            while waiting.wait.waiting:
                answered += await self._arrived(waiting)
        return {result.request_id: result for result in answered}

    def _waiting(self, request_ids: Sequence[str], timeout_s: float | None) -> AsyncWaiting:
        """A wait for ``request_ids`` (``timeout_s``, else the longest request lifetime)."""
        if timeout_s is None:
            timeout_s = self._core.default_timeout_s()
        cancel = self._cancel_quietly if self._core.cancel_on_exit else None
        arrived = AsyncArrivals(self._deadlines)
        return AsyncWaiting(ResultWait(request_ids, timeout_s), arrived, self._listener, cancel)

    async def _first_answers(
        self,
        waiting: AsyncWaiting,
        admission: Callable[[], Awaitable[set[str]]] | None = None,
    ) -> list[Result]:
        """Registers ``waiting`` with the inbox listener and returns the answers already
        stored. Ids whose answers are pushed to this producer's inbox (held by ``submit``, or
        enqueued by ``admission``, which it runs) need no watch call."""
        wait = waiting.wait
        try:
            wait.models = await self._models_of(wait.ids, wait.deadline)
        except BrokerUnavailable as outage:
            raise wait.timed_out(outage) from outage
        pushed: set[str] = set()  # answers pushed to this producer's inbox
        for model, ids in wait.by_model().items():
            pushed |= self._listener.expect(model, ids, waiting.arrived)
        if admission is not None:
            pushed |= await admission()
        return await self._stored(wait, pushed)

    async def _arrived(self, waiting: AsyncWaiting) -> list[Result]:
        """What the inbox listener brings next for ``waiting``: the answers of one delivery it
        waits for (none of others), or after a reconnection every stored one (as ``_stored``).

        Raises:
            ResultTimeout: nothing came before the wait's deadline (naming the outage when
                Redis cannot be reached then).
            BrokerError: the listener's error (a subclass of ``BatchfleetError``).
        """
        wait = waiting.wait
        try:
            item = await waiting.arrived.get(wait.left_s())
        except TimeoutError:
            raise wait.timed_out(await self._outage()) from None
        if isinstance(item, Reconnected):
            return await self._stored(wait)
        if isinstance(item, BaseException):
            raise item
        return [result for result in item if self._took(wait, result)]

    def _took(self, wait: ResultWait, result: Result) -> bool:
        """Whether ``result`` answers an id ``wait`` still waits for; if so, ``wait`` takes
        it and it is noted answered (not to cancel on close)."""
        if not wait.take(result):
            return False
        self._core.answered(result.request_id)
        return True

    async def _outage(self) -> BrokerUnavailable | None:
        """Why Redis cannot be reached now (one ``PING``); None when it can."""
        try:
            with broker_errors():
                await self._client.ping()
        except BrokerUnavailable as outage:
            return outage
        return None

    async def _stored(self, wait: ResultWait, pushed: Collection[str] = ()) -> list[Result]:
        """The stored results of the ids ``wait`` still waits for, but ``pushed``; see
        ``Producer._stored``. Waits of one loop turn share their watch calls."""
        stored = []
        for model, ids in wait.by_model(skipping=pushed).items():
            for batch in chunks(ids, self._core.settings.submit_chunk):
                watch = partial(self._watch_ids, (model, batch))
                try:
                    read = await call_until_async(wait.deadline, watch)
                except BrokerUnavailable as outage:
                    raise wait.timed_out(outage) from outage
                stored += [
                    result for result in read if result is not None and self._took(wait, result)
                ]
        return stored

    async def _models_of(self, request_ids: Sequence[str], deadline: float) -> dict[str, str]:
        """The model of each of ``request_ids``; see ``Producer._models_of``."""
        models, unknown = self._core.known_models(request_ids)
        if not unknown:
            return models
        await self._follow_fleet(deadline)  # the models to look among
        for batch in chunks(unknown, self._core.settings.submit_chunk):
            look_up = self._core.look_up(batch)
            replies = await call_until_async(deadline, partial(self._run, look_up.queue))
            models.update(look_up.read(replies))
        return models

    async def _run(self, queue: Callable[[AsyncPipeline], None]) -> list[Any]:
        """The replies of a pipeline (no transaction) ``queue`` fills."""
        async with self._client.pipeline(transaction=False) as pipe:
            queue(pipe)
            return await pipe.execute()

    async def infer(
        self,
        model: str,
        inputs: Sequence[Any],
        timeout_s: float | None = None,
        *,
        deadline_s: float | None = None,
    ) -> list[Any]:
        """Submits ``inputs`` and returns their outputs in input order; see ``Producer.infer``."""
        checked = await self._check(model, inputs, deadline_s=deadline_s)
        ids = checked.request_ids
        self._core.remember(model, ids)
        admission = partial(self._enqueue, model, checked, waiting=True)
        by_id = await self._collected(ids, timeout_s, admission)
        return [by_id[request_id].unwrap() for request_id in ids]

    async def aclose(self) -> None:
        """Cancels what it still waits for (with ``cancel_on_exit``), stops the inbox
        listener and releases connections."""
        await self._cancel_quietly(self._core.outstanding())
        await self._listener.aclose()
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
