"""``Producer``: the blocking client that submits requests and waits for their results."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from functools import partial
from queue import Empty, SimpleQueue
from time import monotonic
from types import TracebackType
from typing import Any

import redis
from redis.client import Pipeline
from redis.commands.core import Script

from config import lua
from config.connection import broker_errors, connect, is_outage
from config.errors import (
    BatchfleetError,
    BrokerUnavailable,
    RedisAccessDenied,
    RequestRejected,
    ResultTimeout,
)
from config.replica_wait import ReplicaWait
from config.schema import Result
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
from producer.outages import Backoff, call_until, single_try
from producer.waiters import Arrival, InboxWaits, Reconnected, ResultWait

LISTEN_BLOCK_S = 1
WAKE_SENTINEL = ""


class InboxListener(InboxWaits):
    """One thread and one blocking read per model's inbox: hands each result pushed there to
    its waiters."""

    def __init__(self, client: redis.Redis, inbox: Callable[[str], str]) -> None:
        super().__init__()
        self._client = client
        self._inbox = inbox
        self._closed = threading.Event()
        self._threads: dict[str, threading.Thread] = {}  # by inbox
        self._start_lock = threading.Lock()

    def _listen(self, model: str) -> None:
        inbox = self._inbox(model)
        with self._start_lock:
            if inbox not in self._threads:
                thread = threading.Thread(
                    target=self._run, args=(inbox,), name="batchfleet-inbox", daemon=True
                )
                self._threads[inbox] = thread
                thread.start()

    def close(self) -> None:
        """Stops the listening threads and deletes their inboxes."""
        self._closed.set()
        with self._start_lock:
            threads = dict(self._threads)
        for inbox in threads:
            with contextlib.suppress(redis.RedisError):
                self._client.lpush(inbox, WAKE_SENTINEL)
        for inbox, thread in threads.items():
            thread.join(timeout=LISTEN_BLOCK_S + 1)
            with contextlib.suppress(redis.RedisError):
                self._client.delete(inbox)
        self._client.close()

    def _run(self, inbox: str) -> None:
        away: Backoff | None = None  # set while Redis cannot be reached
        while not self._closed.is_set():
            try:
                if away is not None:
                    self._client.ping()
                    away = None
                    self._waiters.reconnected()
                # A reply lost on the way loses the results it popped: once back, the
                # waiters read them where they are stored.
                pipe = self._client.pipeline(transaction=False)
                queue_inbox_take(pipe, inbox, LISTEN_BLOCK_S)
                popped = inbox_taken(pipe.execute())
            except redis.RedisError as exc:
                if not is_outage(exc):
                    self._waiters.fail_all(RedisAccessDenied(f"Redis refused the inbox: {exc}"))
                away = away or Backoff()
                self._closed.wait(away.next_pause_s())
                continue
            if popped:
                self._waiters.deliver(read_inbox(popped))


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
        self._client = client or connect(self._core.settings, retry=single_try())
        self._claim = lua.register(self._client, "claim_request_id")
        self._admit = lua.register(self._client, "admit")
        self._watch = lua.register(self._client, "watch")
        self._cancel = lua.register(self._client, "cancel")
        self._stream_admit = lua.register(self._client, "stream_admit")
        self._replica_wait = ReplicaWait.of(self._core.settings)
        self._listener = InboxListener(
            listen_client or connect(self._core.settings, retry=single_try()), self._core.inbox
        )

    @property
    def producer_id(self) -> str:
        return self._core.producer_id

    def _admitted(
        self,
        script: Script,
        items: Sequence[Prepared],
        call: Callable[[Sequence[Prepared]], tuple[list[Any], list[Any]]],
    ) -> list[Any]:
        """Each of ``items``' (one model's) admission status, by ``script`` with the keys and
        args ``call`` builds, all or nothing, tried for ``submit_retry_s`` while Redis cannot
        be reached (an admission is idempotent: a retry never enqueues twice)."""
        admit = partial(self._admit_now, script, items, call)
        return call_until(self._core.submit_deadline(), admit)

    def _admit_now(
        self,
        script: Script,
        items: Sequence[Prepared],
        call: Callable[[Sequence[Prepared]], tuple[list[Any], list[Any]]],
    ) -> list[Any]:
        """``_admitted``, tried once: the callers' ids claimed for the model in one round
        trip, then the rest in another (with ``redis_wait_replicas``, once enough replicas
        have the writes, else ``BrokerUnavailable``)."""
        owners: dict[str, Any] = {}
        if any(item.callers_id for item in items):
            claims = partial(self._core.queue_claims, items=items, script=self._claim)
            replies = lua.execute(self._client, claims, [self._claim])
            owners = self._core.claim_owners(items, replies)
        admissible, statuses = self._core.after_claims(items, owners, one_by_one=False)
        refused = self._core.claim_refusals(items, statuses)
        if refused is not None:
            with contextlib.suppress(redis.RedisError):  # best effort: the refusal stands
                self._client.hincrby(*refused)
        if not admissible:
            return statuses
        admission = partial(
            self._core.queue_admission,
            script=script,
            call=call(admissible),
            replica_wait=self._replica_wait,
        )
        replies = lua.execute(self._client, admission, [script])
        return self._core.admission_statuses(statuses, replies, self._replica_wait)

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

        The request is admitted with this producer as its waiter: its answer is pushed to
        the producer's inbox, and a ``result`` for it here needs no watch call. It is held
        before the admission is sent, so that an answer that comes first is kept for the
        ``result`` that follows.

        Args:
            model: a model the fleet serves.
            input: any JSON-serialisable value, at most the model's ``max_input_bytes``.
            request_id: your own id; resubmitting it with the same input does not run twice.
            deadline_s: seconds from now after which the request is dropped as ``expired``;
                the model's ``request_timeout_s`` when omitted.
            priority: ``high``, ``normal`` or ``low``, for a model with ``priorities``.

        Raises:
            RequestRejected: (a subclass) refused; nothing was enqueued.
            BrokerUnavailable: Redis could not be reached for ``submit_retry_s`` (the
                admission is tried again meanwhile, never enqueued twice).
        """
        ids = None if request_id is None else [request_id]
        checked = self._check(
            model, [input], request_ids=ids, deadline_s=deadline_s, priority=priority
        )
        (prepared,) = self._core.build(checked)
        self._listener.hold(model, [prepared.request_id])
        reply: str | bytes = ""
        try:
            call = partial(self._core.admit_call, waiting=True)
            (reply,) = self._admitted(self._admit, [prepared], call)
            self._core.check_admission(prepared, reply)
        finally:
            if not self._core.enqueued([prepared], [reply]):
                self._listener.release([prepared.request_id])
        self._core.submitted(model, [prepared.request_id])
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
            BrokerUnavailable: Redis could not be reached for ``submit_retry_s`` (each
                chunk's admission is tried again meanwhile, never enqueued twice);
                ``accepted_ids`` as above.
        """
        checked = self._check(
            model, inputs, request_ids=request_ids, deadline_s=deadline_s, priority=priority
        )
        self._enqueue(model, checked)
        return checked.request_ids

    def _enqueue(self, model: str, checked: CheckedInputs, waiting: bool = False) -> set[str]:
        """Admits ``checked`` chunk by chunk, each built as its turn comes (the first runs
        while the rest are built), as ``submit_many`` says; ``waiting``, with this producer's
        inbox as the waiter of each request it enqueues, whose ids it returns."""
        accepted: list[str] = []
        enqueued: set[str] = set()
        call = partial(self._core.admit_call, waiting=waiting)
        for chunk in self._core.admission_chunks(checked):
            try:
                replies = self._admitted(self._admit, chunk, call)
                ids = self._core.check_chunk(chunk, replies)
            except (RequestRejected, BrokerUnavailable) as refusal:
                refusal.accepted_ids = accepted
                raise
            self._core.submitted(model, ids)
            accepted.extend(ids)
            if waiting:
                enqueued |= self._core.enqueued(chunk, replies)
        return enqueued

    def _follow_fleet(self, deadline: float | None = None) -> None:
        """Reads the fleet's model policies when they are due (every few seconds): the first
        time trying until ``deadline`` (``submit_retry_s`` from now) while Redis cannot be
        reached, later once, keeping the last ones read when that fails."""
        fleet = self._core.fleet
        if not fleet.due(monotonic()):
            return
        read = partial(self._client.hgetall, self._core.keys.policies())
        if not fleet.followed():
            published = call_until(deadline or self._core.submit_deadline(), read)
        else:
            try:
                published = call_until(monotonic(), read)  # one try
            except BrokerUnavailable:
                fleet.postpone(monotonic())
                return
        fleet.adopt(published, monotonic())

    def models(self) -> list[str]:
        """The models this producer serves: the fleet's (every model a batcher published),
        and those only its own configuration names.

        Raises:
            BrokerUnavailable: Redis cannot be reached.
        """
        self._follow_fleet()
        return sorted(self._core.fleet.models)

    def policy(self, model: str) -> ModelPolicy:
        """The policy the fleet serves ``model`` with (its batchers', else this producer's
        configuration): queue cap, input size, deadline, priorities, response cache.

        Raises:
            UnknownModel: neither the fleet nor this producer's configuration serves it.
            BrokerUnavailable: Redis cannot be reached.
        """
        self._follow_fleet()
        return self._core.policy(model)

    def _check(self, model: str, inputs: Iterable[Any], **options: Any) -> CheckedInputs:
        """Validates every input (``ProducerCore.check_all``) by the fleet's policies; a
        refusal is counted in the model's stats, best effort."""
        self._follow_fleet()
        try:
            return self._core.check_all(model, inputs, **options)
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
            BrokerUnavailable: Redis could not be reached for ``submit_retry_s`` at admission.
                Once streaming, a read that cannot reach Redis is tried again until the
                stream's own time runs out (``ResultTimeout``).
        """
        ids = None if request_id is None else [request_id]
        checked = self._check(model, [input], request_ids=ids, deadline_s=deadline_s)
        (prepared,) = self._core.build(checked)
        (reply,) = self._admitted(self._stream_admit, [prepared], self._core.stream_call)
        self._core.check_admission(prepared, reply)
        self._core.remember(model, [prepared.request_id])
        return self._chunks(prepared)

    def _chunks(self, prepared: Prepared) -> Iterator[dict[str, Any]]:
        request_id = prepared.request_id
        reader = StreamReader(
            self._core.keys, prepared.model, request_id, prepared.request.deadline_at
        )
        away: Backoff | None = None  # set while Redis cannot be reached
        try:
            while not reader.finished:
                block_ms = reader.block_ms()
                try:
                    with broker_errors():
                        streams: dict[Any, Any] = {reader.key: reader.last}
                        reply = self._client.xread(streams, count=100, block=block_ms)
                        # Nothing came: answered without a last chunk for us (cancelled)?
                        raw = None if reply else self._client.get(reader.result_key)
                except BrokerUnavailable:
                    away = away or Backoff()
                    time.sleep(away.next_pause_s())
                    continue
                if away is not None:
                    away = None
                    reader.reconnected()
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
            ResultTimeout: no final answer within ``timeout_s`` (as ``results``).
            UnknownRequest: the id was never accepted, or its result expired.
            RedisAccessDenied: Redis refused this producer's credentials or commands.
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
                yielded first); ``pending_ids`` names the others, each still valid to ask for.
                While Redis cannot be reached (a stall, a restart, a failover) the wait goes
                on, reconnecting, and reads every stored result once back: it ends early
                only on this.
            UnknownRequest: an id was never accepted, or its result expired.
            RedisAccessDenied: Redis refused this producer's credentials or commands.
        """
        yield from self._answers(self._results(request_ids, timeout_s))

    def _answers(self, results: Iterator[Result]) -> Iterator[Result]:
        """``results``, each noted answered (not to cancel on close)."""
        for result in results:
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
        model = self._models_of([request_id], deadline=monotonic())[request_id]
        record_key = self._core.keys.record(model, request_id)
        with broker_errors():
            status = RECORD_CHANGED
            while status == RECORD_CHANGED:
                record = self._client.get(record_key)
                keys, args = self._core.cancel_call(model, request_id, record)
                status = self._core.cancel_status(self._cancel(keys=keys, args=args))
        self._core.answered(request_id)
        return self._core.read_cancel(request_id, status)

    def _results(
        self,
        request_ids: Sequence[str],
        timeout_s: float | None,
        admission: Callable[[], set[str]] | None = None,
    ) -> Iterator[Result]:
        """``results``; with ``admission``, the requests are admitted once the inbox listener
        expects them (their answers can come at once). Ids whose answers are pushed to this
        producer's inbox (held by ``submit``, or enqueued by ``admission``) need no watch
        call."""
        if timeout_s is None:
            timeout_s = self._core.default_timeout_s()
        wait = ResultWait(request_ids, timeout_s)
        try:
            wait.models = self._models_of(wait.ids, wait.deadline)
        except BrokerUnavailable as outage:
            raise wait.timed_out(outage) from outage
        arrived: SimpleQueue[Arrival] = SimpleQueue()
        pushed: set[str] = set()  # answers pushed to this producer's inbox
        for model, ids in wait.by_model().items():
            pushed |= self._listener.expect(model, ids, arrived)
        try:
            if admission is not None:
                pushed |= admission()
            yield from self._stored(wait, pushed)
            while wait.waiting:
                try:
                    item = arrived.get(timeout=wait.left_s())
                except Empty:
                    raise wait.timed_out(self._outage()) from None
                if isinstance(item, Reconnected):
                    yield from self._stored(wait)
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield from (result for result in item if wait.take(result))
        finally:
            self._listener.forget(wait.ids, arrived)

    def _outage(self) -> BrokerUnavailable | None:
        """Why Redis cannot be reached now (one ``PING``); None when it can."""
        try:
            with broker_errors():
                self._client.ping()
        except BrokerUnavailable as outage:
            return outage
        return None

    def _stored(self, wait: ResultWait, pushed: Collection[str] = ()) -> Iterator[Result]:
        """Yields the stored results of the ids ``wait`` still waits for, but those whose
        answers are ``pushed`` to this producer's inbox, registering this producer's inbox for
        the others: one watch call per ``submit_chunk`` ids, each tried until the wait's
        deadline while Redis cannot be reached."""
        for model, ids in wait.by_model(skipping=pushed).items():
            for batch in chunks(ids, self._core.settings.submit_chunk):
                keys, args = self._core.watch_call(model, batch)
                try:
                    reply = call_until(wait.deadline, partial(self._watch, keys, args))
                except BrokerUnavailable as outage:
                    raise wait.timed_out(outage) from outage
                for result in self._core.read_watch(batch, reply):
                    if result is not None and wait.take(result):
                        yield result

    def _models_of(self, request_ids: Sequence[str], deadline: float) -> dict[str, str]:
        """The model of each of ``request_ids``: those this producer admitted lately it
        knows, the others it looks up (``ModelLookUp``) among the models the fleet serves, one
        round trip per ``submit_chunk``, tried until ``deadline`` while Redis cannot be
        reached.

        Raises:
            UnknownRequest: an id no model knows.
            BrokerUnavailable: Redis was away until ``deadline``.
        """
        models, unknown = self._core.known_models(request_ids)
        if not unknown:
            return models
        self._follow_fleet(deadline)  # the models to look among
        for batch in chunks(unknown, self._core.settings.submit_chunk):
            look_up = self._core.look_up(batch)
            models.update(look_up.read(call_until(deadline, partial(self._run, look_up.queue))))
        return models

    def _run(self, queue: Callable[[Pipeline], None]) -> list[Any]:
        """The replies of a pipeline (no transaction) ``queue`` fills."""
        with self._client.pipeline(transaction=False) as pipe:
            queue(pipe)
            return pipe.execute()

    def infer(
        self,
        model: str,
        inputs: Sequence[Any],
        timeout_s: float | None = None,
        *,
        deadline_s: float | None = None,
    ) -> list[Any]:
        """Submits ``inputs`` and returns their outputs in input order, waiting at most
        ``timeout_s`` from the call (the submit included). The requests are admitted with
        this producer as their waiter, so their answers come without a watch round trip.

        Raises:
            RequestFailed: (a subclass) the first failed request's error.
            RequestRejected, BrokerUnavailable: as ``submit_many``.
            ResultTimeout, UnknownRequest, RedisAccessDenied: as ``results``.
        """
        checked = self._check(model, inputs, deadline_s=deadline_s)
        ids = checked.request_ids
        self._core.remember(model, ids)
        admission = partial(self._enqueue, model, checked, waiting=True)
        results = self._answers(self._results(ids, timeout_s, admission))
        by_id = {result.request_id: result for result in results}
        return [by_id[request_id].unwrap() for request_id in ids]

    def close(self) -> None:
        """Cancels what it still waits for (with ``cancel_on_exit``), stops the inbox
        listener and releases connections."""
        for request_id in self._core.outstanding():
            with contextlib.suppress(BatchfleetError):  # best effort: closing goes on
                self.cancel(request_id)
        self._listener.close()
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
