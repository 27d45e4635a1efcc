"""``Producer``: the blocking client that submits requests and waits for their results."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Generator, Iterable, Iterator, Sequence
from queue import Empty, SimpleQueue
from time import monotonic
from types import TracebackType
from typing import Any

import redis

from config import lua
from config.connection import REDIS_RETRY_PAUSE_S, broker_errors, connect
from config.errors import BatchfleetError, BrokerUnavailable, RequestRejected, ResultTimeout
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
from producer.waiters import ResultQueue, Waiters

LISTEN_BLOCK_S = 1
WAKE_SENTINEL = ""


class InboxListener:
    """One thread, one blocking read: hands each result pushed to the inbox to its waiters."""

    def __init__(self, client: redis.Redis, inbox: str) -> None:
        self._client = client
        self._inbox = inbox
        self._waiters = Waiters()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def expect(self, request_ids: Iterable[str], queue: ResultQueue) -> None:
        """Puts each of ``request_ids``' results in ``queue`` when it arrives (or the error
        that ends the wait)."""
        self._waiters.add(request_ids, queue)
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="batchfleet-inbox", daemon=True
                )
                self._thread.start()

    def forget(self, request_ids: Iterable[str], queue: ResultQueue) -> None:
        self._waiters.remove(request_ids, queue)

    def close(self) -> None:
        self._closed.set()
        if self._thread is None:
            return
        with contextlib.suppress(redis.RedisError):
            self._client.lpush(self._inbox, WAKE_SENTINEL)
        self._thread.join(timeout=LISTEN_BLOCK_S + 1)
        self._client.close()

    def _run(self) -> None:
        while not self._closed.is_set():
            try:
                item = self._client.blpop([self._inbox], timeout=LISTEN_BLOCK_S)
            except redis.RedisError as exc:
                self._waiters.fail_all(BrokerUnavailable(f"Redis is unavailable: {exc}"))
                self._closed.wait(REDIS_RETRY_PAUSE_S)
                continue
            if item is None:
                continue
            try:  # a batch finalizes many results at once: take them in one more round trip
                rest = self._client.lpop(self._inbox, INBOX_DRAIN) or []
            except redis.RedisError as exc:
                # Redis may have popped results this reply lost: their waiters must not wait
                # in vain. They get a typed error; asking again finds the stored results.
                self._waiters.deliver(read_inbox([item[1]]))
                self._waiters.fail_all(BrokerUnavailable(f"Redis is unavailable: {exc}"))
                continue
            self._waiters.deliver(read_inbox([item[1], *rest]))


class Producer:
    """Submits requests to the fleet and waits for their results, blocking. With
    ``cancel_on_exit``, closing it (leaving its ``with`` block) cancels the requests it
    submitted and has not received an answer for.

    Example::

        with Producer() as producer:
            outputs = producer.infer("synthetic", ["a", "b", "c"])
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        client: redis.Redis | None = None,
        listen_client: redis.Redis | None = None,
        producer_id: str | None = None,
        cancel_on_exit: bool = False,
    ) -> None:
        self._core = ProducerCore(settings or load_settings(), producer_id, cancel_on_exit)
        self._client = client or connect(self._core.settings)
        self._admit = lua.register(self._client, "admit")
        self._watch = lua.register(self._client, "watch")
        self._cancel = lua.register(self._client, "cancel")
        self._stream_admit = lua.register(self._client, "stream_admit")
        self._listener = InboxListener(
            listen_client or connect(self._core.settings), self._core.inbox
        )

    @property
    def producer_id(self) -> str:
        return self._core.producer_id

    def submit(
        self,
        model: str,
        input: Any,
        *,
        request_id: str | None = None,
        deadline_s: float | None = None,
        priority: str = "normal",
    ) -> str:
        """Enqueues one request and returns its id.

        Args:
            model: a model the fleet serves.
            input: any JSON-serialisable value, at most the model's ``max_input_bytes``.
            request_id: your own id; resubmitting it with the same input does not run twice.
            deadline_s: seconds from now after which the request is dropped as ``expired``;
                the model's ``request_timeout_s`` when omitted.
            priority: ``high``, ``normal`` or ``low``, for a model with ``priorities``.

        Raises:
            RequestRejected: (a subclass) refused; nothing was enqueued.
            BrokerUnavailable: Redis cannot be reached.
        """
        ids = None if request_id is None else [request_id]
        (prepared,) = self._prepare(
            model, [input], request_ids=ids, deadline_s=deadline_s, priority=priority
        )
        keys, args = self._core.admit_call([prepared])
        with broker_errors():
            (reply,) = self._admit(keys=keys, args=args)
        self._core.check_admission(prepared, reply)
        self._core.submitted([prepared.request_id])
        return prepared.request_id

    def submit_many(
        self,
        model: str,
        inputs: Iterable[Any],
        *,
        request_ids: Sequence[str] | None = None,
        deadline_s: float | None = None,
        priority: str = "normal",
    ) -> list[str]:
        """Enqueues many requests, one round trip per chunk of 256, and returns their ids.

        Every input is validated before any is enqueued, and each chunk (of at most 256, and
        at most the model's ``max_queue_len``) is admitted whole or not at all. With
        ``request_ids`` (one per input) the ids are yours: resubmitting one with the same
        input does not run it twice.

        Raises:
            RequestRejected: (a subclass) refused; nothing of the refused chunk was enqueued,
                and ``accepted_ids`` lists the ids of the earlier chunks, all taken (enqueued,
                already queued with the same input, or answered from the cache); none for a
                call of one chunk. ``RequestIdConflict.conflicting_ids`` names the reused ids;
                ``QueueFull`` means no room for the whole chunk.
            BrokerUnavailable: Redis cannot be reached.
        """
        prepared = self._prepare(
            model, inputs, request_ids=request_ids, deadline_s=deadline_s, priority=priority
        )
        accepted: list[str] = []
        for chunk in self._core.admission_chunks(prepared):
            keys, args = self._core.admit_call(chunk)
            with broker_errors():
                replies = self._admit(keys=keys, args=args)
            try:
                ids = self._core.check_chunk(chunk, replies)
            except RequestRejected as refusal:
                refusal.accepted_ids = accepted
                raise
            self._core.submitted(ids)
            accepted.extend(ids)
        return accepted

    def _follow_fleet(self) -> None:
        """Reads the fleet's model policies when they are due (every few seconds)."""
        if self._core.fleet.due(monotonic()):
            with broker_errors():
                published = self._client.hgetall(self._core.keys.policies())
            self._core.fleet.adopt(published, monotonic())

    def policy(self, model: str) -> ModelPolicy:
        """The policy the fleet serves ``model`` with (its batchers', else this producer's
        configuration): queue cap, input size, deadline, priorities, response cache.

        Raises:
            UnknownModel: neither the fleet nor this producer's configuration serves it.
            BrokerUnavailable: Redis cannot be reached.
        """
        self._follow_fleet()
        return self._core.policy(model)

    def _prepare(self, model: str, inputs: Iterable[Any], **options: Any) -> list[Prepared]:
        """Validates every input (``ProducerCore.prepare_all``) by the fleet's policies; a
        refusal is counted in the model's stats, best effort."""
        self._follow_fleet()
        try:
            return self._core.prepare_all(model, inputs, **options)
        except RequestRejected as refusal:
            counter = self._core.refusal_count(model, refusal)
            if counter is not None:
                with contextlib.suppress(redis.RedisError):
                    self._client.hincrby(*counter, 1)
            raise

    def stream(
        self,
        model: str,
        input: Any,
        *,
        request_id: str | None = None,
        deadline_s: float | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Sends one request down its model's streaming lane (past the batcher) and yields
        its chunks as the model produces them: ``{"delta": text}`` …, then the last,
        ``{"final": True, "text", "finish_reason", "usage"}``; the complete output is also the
        request's result. Leaving the loop early cancels the request, which stops the model.

        Raises:
            RequestRejected: (a subclass) refused; nothing was enqueued.
            RequestFailed: (a subclass) the stream ended with an error.
            ResultTimeout: the first chunk did not come by the request's deadline (plus a
                grace of 5 s), or a later one not within 30 s of the one before.
            InvalidInput: no worker serves the model's streaming lane (it cannot stream).
            BrokerUnavailable: Redis cannot be reached.
        """
        ids = None if request_id is None else [request_id]
        (prepared,) = self._prepare(model, [input], request_ids=ids, deadline_s=deadline_s)
        keys, args = self._core.stream_call(prepared)
        with broker_errors():
            reply = self._stream_admit(keys=keys, args=args)
        self._core.check_admission(prepared, reply)
        return self._chunks(prepared.request_id, prepared.request.deadline_at)

    def _chunks(self, request_id: str, deadline_at: float) -> Iterator[dict[str, Any]]:
        reader = StreamReader(self._core.keys, request_id, deadline_at)
        try:
            while not reader.finished:
                block_ms = reader.block_ms()
                with broker_errors():
                    streams: dict[Any, Any] = {reader.key: reader.last}
                    reply = self._client.xread(streams, count=100, block=block_ms)
                    # Nothing came: answered without a last chunk for us (cancelled)?
                    raw = None if reply else self._client.get(reader.result_key)
                yield from reader.chunks(reply)
                ended = reader.ended(raw)
                if ended is not None:
                    yield ended
        finally:
            if not reader.finished:
                with contextlib.suppress(BatchfleetError):  # the caller went away: stop it
                    self.cancel(request_id)

    def validate(self, model: str, input: Any) -> None:
        """Checks, without enqueuing, that ``input`` would be accepted for ``model``.

        Raises:
            RequestRejected: (a subclass) what ``submit`` would refuse it with.
            BrokerUnavailable: Redis cannot be reached (to read the fleet's policies).
        """
        self._follow_fleet()
        self._core.prepare(model, input)

    def result(self, request_id: str, timeout_s: float | None = None) -> Any:
        """Waits for one request's output.

        Raises:
            RequestFailed: (a subclass by error code) the request ended with an error.
            ResultTimeout: no final answer within ``timeout_s``.
            UnknownRequest: the id was never accepted, or its result expired.
            BrokerUnavailable: Redis cannot be reached.
        """
        for result in self.results([request_id], timeout_s=timeout_s):
            return result.unwrap()
        raise ResultTimeout(f"no result for {request_id!r}")

    def results(
        self, request_ids: Sequence[str], timeout_s: float | None = None
    ) -> Iterator[Result]:
        """Yields each request's final ``Result`` as it completes (errors included, not raised).

        Raises:
            ResultTimeout: some results did not come within ``timeout_s`` (those that did were
                yielded first).
            UnknownRequest: an id was never accepted, or its result expired.
            BrokerUnavailable: Redis cannot be reached.
        """
        for result in self._results(request_ids, timeout_s):
            self._core.answered(result.request_id)
            yield result

    def cancel(self, request_id: str) -> bool:
        """Cancels a request: queued, it never runs; in a batch already running, its output
        is discarded. Either way its answer is a ``cancelled`` error (``RequestCancelled``)
        for every caller. Returns False when it already had its final answer.

        Raises:
            UnknownRequest: the id was never accepted, or its result expired.
            BrokerUnavailable: Redis cannot be reached.
        """
        record_key = self._core.keys.record(request_id)
        with broker_errors():
            status = RECORD_CHANGED
            while status == RECORD_CHANGED:
                record = self._client.get(record_key)
                keys, args = self._core.cancel_call(request_id, record)
                status = self._core.cancel_status(self._cancel(keys=keys, args=args))
        self._core.answered(request_id)
        return self._core.read_cancel(request_id, status)

    def _results(self, request_ids: Sequence[str], timeout_s: float | None) -> Iterator[Result]:
        if timeout_s is None:
            timeout_s = self._core.default_timeout_s()
        deadline = monotonic() + timeout_s
        ids = list(dict.fromkeys(request_ids))
        arrived: SimpleQueue[Result | BaseException] = SimpleQueue()
        self._listener.expect(ids, arrived)
        try:
            waiting = yield from self._already_done(ids)
            while waiting:
                try:
                    item = arrived.get(timeout=max(deadline - monotonic(), 0))
                except Empty:
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

    def _already_done(self, request_ids: Sequence[str]) -> Generator[Result, None, set[str]]:
        """Yields the results already final; returns the ids still pending."""
        pending: set[str] = set()
        for batch in chunks(request_ids, self._core.settings.submit_chunk):
            keys, args = self._core.watch_call(batch)
            with broker_errors():
                reply = self._watch(keys=keys, args=args)
            for request_id, result in zip(batch, self._core.read_watch(batch, reply), strict=True):
                if result is None:
                    pending.add(request_id)
                else:
                    yield result
        return pending

    def infer(
        self,
        model: str,
        inputs: Sequence[Any],
        timeout_s: float | None = None,
        *,
        deadline_s: float | None = None,
    ) -> list[Any]:
        """Submits ``inputs`` and returns their outputs in input order.

        Raises:
            RequestFailed: (a subclass) the first failed request's error.
            ResultTimeout, RequestRejected, BrokerUnavailable: as ``submit_many`` and ``results``.
        """
        ids = self.submit_many(model, inputs, deadline_s=deadline_s)
        by_id = {result.request_id: result for result in self.results(ids, timeout_s=timeout_s)}
        return [by_id[request_id].unwrap() for request_id in ids]

    def close(self) -> None:
        """Cancels what it still waits for (with ``cancel_on_exit``), stops the inbox
        listener and releases connections."""
        for request_id in self._core.outstanding():
            with contextlib.suppress(BatchfleetError):  # best effort: closing goes on
                self.cancel(request_id)
        self._listener.close()
        with contextlib.suppress(redis.RedisError):
            self._client.delete(self._core.inbox)
        self._client.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
