"""The batcher: reads each model's request stream and sends micro-batches as Celery tasks.

One thread per model. Requests stay pending in the stream's consumer group until a worker
writes their final answer, so a request held by a dead batcher or worker is found idle past
``batcher.reclaim_lease_s`` (``XPENDING … IDLE``), taken over (``XCLAIM``) and sent again.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from time import monotonic
from typing import Any

import redis
from celery import Celery
from kombu.exceptions import OperationalError

from config import lua
from config.batch_task import RUN_BATCH_TASK, BatchTask
from config.connection import OUTAGES, REDIS_RETRY_PAUSE_S, connect
from config.garbage_collection import settle_garbage_collection
from config.keys import CONSUMER_GROUP, Keys, held_on_device
from config.published_policy import encode_policy
from config.replica_wait import ReplicaWait
from config.schema import PRIORITY_RANK
from config.settings import ModelPolicy, Settings
from workers.batcher.metrics import batcher_registry
from workers.batcher.policy import FULL_BATCHES_AHEAD, FULL_REASONS, Pending, Plan, plan_batch
from workers.models.registry import cost_function
from workers.protocol.batch_cap import BatchCap
from workers.protocol.capacity import Capacity, FleetState, RoomRule
from workers.protocol.celery_app import make_celery_app
from workers.protocol.entries import (
    StreamEntry,
    ensure_group,
    entries_of,
    read_entries,
    to_text,
)
from workers.protocol.health import Health
from workers.protocol.metrics_endpoint import serve_metrics
from workers.protocol.model_times import ModelTimeEstimate
from workers.protocol.results import ResultWriter, error_answer, poison_answer
from workers.protocol.task_message import batch_message

log = logging.getLogger(__name__)

MAX_BLOCK_S = 1.0
# Redis checks blocked clients' timeouts on its ~100 ms cron tick (hz 10), so a BLOCK shorter
# than this wakes late; such waits are slept here, then the stream is read without blocking.
PRECISE_BLOCK_S = 0.1
# While every worker slot is busy, the unread backlog is scanned this often for requests past
# their deadline, BACKLOG_SCAN_COUNT entries at a time, resuming where the last scan stopped.
BACKLOG_SCAN_S = 0.2
# Batches the batcher forms itself (by cost or priority) choose among this many batches' worth
# of queued requests.
LOOKAHEAD_BATCHES = 64
BACKLOG_SCAN_COUNT = 200
RECLAIM_PAGE = 100
RECLAIM_PAGES = 100


def stream_id_order(entry_id: str) -> tuple[int, int]:
    """Sorts stream ids as Redis does: by milliseconds, then sequence."""
    millis, _, sequence = entry_id.partition("-")
    return int(millis), int(sequence or 0)


def default_batcher_name() -> str:
    """Stable across restarts on one host, so a restarted batcher resumes its own pending reads."""
    return f"batcher@{socket.gethostname()}"


class ModelBatcher:
    """Forms and dispatches the micro-batches of one model."""

    def __init__(
        self,
        settings: Settings,
        model: str,
        *,
        client: redis.Redis,
        celery: Celery,
        consumer: str,
    ) -> None:
        self.settings = settings
        self.model = model
        self.policy = settings.policy(model)
        self.keys = Keys(settings.key_prefix)
        self.stream = self.keys.stream(model)
        self.consumer = consumer
        self._client = client
        self._celery = celery
        self._broker_is_fleet_redis = settings.broker_url is None
        self._state = FleetState(client, self.keys, model)
        self._writer = ResultWriter(client, self.keys, model, replica_wait=ReplicaWait.of(settings))
        self._prune_consumers = lua.register(client, "prune_consumers")
        self._lease_s = settings.batcher.reclaim_lease_s
        self._cost_of = cost_function(self.policy)
        self._batch_cap = BatchCap(client, self.keys, model, self.policy.max_batch_size)
        self._model_times = ModelTimeEstimate(client, self.keys, model)
        self._pool_size = self.policy.max_batch_size * (
            LOOKAHEAD_BATCHES if self.policy.batcher_chooses else 1
        )
        self._pending: dict[str, Pending] = {}
        self.health = Health()
        self._next_reclaim = 0.0
        self._next_backlog_scan = 0.0
        self._backlog_cursor = "0-0"
        self._sending_full = False
        # The capacity the last dispatch, slot wait or read counted, for the next step's
        # decision only: a slot freed after a dispatch wakes the wait that follows, which
        # counts again.
        self._counted: Capacity | None = None
        self.failed = False

    def run(self, stop: threading.Event) -> None:
        """Serves the model until ``stop`` is set, riding out Redis outages.

        Any other failure is a bug: it is logged, ``failed`` is set and every batcher of the
        process stops, so that a supervisor restarts it.
        """
        started = False
        while not stop.is_set():
            self.health.turned()
            try:
                if not started:
                    self._publish_policy()
                    self._ensure_group()
                    self._take(self._read(history=True))
                    started = True
                self.step()
                self.health.reached()
            except (*OUTAGES, OperationalError) as exc:
                log.warning("model %s: Redis unavailable (%s); retrying", self.model, exc)
                stop.wait(REDIS_RETRY_PAUSE_S)
            except redis.ResponseError as exc:
                if "NOGROUP" not in str(exc) and "no such key" not in str(exc):
                    self._fail(stop)
                    continue
                # Redis came back without the stream: it restarted with no persistence. What
                # this batcher held is gone with it; start over on the new, empty stream.
                log.warning(
                    "model %s: the request stream is gone (Redis lost its data); "
                    "dropping %d held requests and starting over",
                    self.model,
                    len(self._pending),
                )
                self._pending.clear()
                self._backlog_cursor = "0-0"
                started = False
            except Exception:
                self._fail(stop)

    def _publish_policy(self) -> None:
        """Tells producers how this model is served: they admit by this policy."""
        self._client.hset(self.keys.policies(), self.model, encode_policy(self.policy))

    def _fail(self, stop: threading.Event) -> None:
        """A bug: logged with its traceback, and every batcher of the process stops."""
        log.exception("model %s: batcher failed", self.model)
        self.failed = True
        stop.set()

    def step(self) -> Plan:
        """One turn: reclaim if due, expire, dispatch at most one batch, or wait for news (a
        full batch that waits for room is sent by the wait, once there is room)."""
        now = monotonic()
        if now >= self._next_reclaim:
            self._reclaim()
            self._next_reclaim = now + self.settings.batcher.reclaim_scan_s
        capacity, self._counted = self._counted or self._state.capacity(self._lease_s), None
        free = capacity.free_slots(self.settings.batcher.batches_per_worker_slot)
        cap = self._batch_cap.current()
        policy = self.policy
        if cap < policy.max_batch_size:  # a device ran out of memory at a larger batch
            policy = policy.model_copy(update={"max_batch_size": cap})
        ahead = capacity.workers * FULL_BATCHES_AHEAD
        plan = plan_batch(
            list(self._pending.values()),
            policy,
            monotonic(),
            free,
            capacity.idle_workers,
            self._model_times.seconds,
            full_ahead=ahead,
        )
        if plan.expired:
            self._expire(plan.expired)
        if plan.batch:
            self._dispatch(plan.batch, plan.flush_reason)
            return plan
        wait_s = min(plan.wait_s if plan.wait_s is not None else MAX_BLOCK_S, MAX_BLOCK_S)
        room = self._pool_size - len(self._pending)
        if free <= 0 or (self.policy.batcher_chooses and self._pending):
            # Unread requests stay in the stream, where a waiting batch takes them when its
            # device frees (late binding); only their deadlines are watched from here. Batches
            # formed by cost fill the pool they choose from, and wait for an idle device.
            if self.policy.batcher_chooses:
                self._take(self._read(count=room, block_s=None))
            elif free + ahead > 0 and room > 0 and self._sending_full:
                # Room for a full batch ahead, and the last batch left full (the stream is
                # deep): fill the pool, and send it if it is full. Otherwise unread requests
                # stay in the stream for the waiting batches to top themselves up with.
                self._take(self._read_and_count(room))
                if len(self._pending) >= policy.max_batch_size:
                    return plan
            if now >= self._next_backlog_scan:
                self._next_backlog_scan = now + BACKLOG_SCAN_S
                self._expire_backlog()
            ready = self._ready_for_room(policy)
            if ready.batch:
                task = self._task(ready.batch, ready.flush_reason)
                self._send_with_read(task, ready.batch, min(wait_s, BACKLOG_SCAN_S))
            else:
                self._counted = self._state.wait_for_slot(
                    min(wait_s, BACKLOG_SCAN_S), self._lease_s
                )
        elif self._pending and wait_s < PRECISE_BLOCK_S:
            time.sleep(wait_s)
            self._take(self._read_and_count(room))
        else:
            self._take(self._read_and_count(room, block_s=wait_s))
        return plan

    def _ensure_group(self) -> None:
        ensure_group(self._client, self.stream, CONSUMER_GROUP)

    def _read(
        self, *, count: int | None = None, block_s: float | None = None, history: bool = False
    ) -> list[StreamEntry]:
        """New entries (or, with ``history``, those this consumer already holds)."""
        if count is not None and count <= 0:
            return []
        reply: Any = self._client.xreadgroup(**self._read_args(count, block_s, history))
        return entries_of(reply)

    def _read_and_count(self, count: int, block_s: float | None = None) -> list[StreamEntry]:
        """New entries, as ``_read`` reads them, and the capacity counted once the read
        returns, for the next step's decision, in the same round trip (on a Redis Cluster,
        whose pipelines take no script calls, the next step counts)."""
        if count <= 0 or isinstance(self._client, redis.cluster.RedisCluster):
            return self._read(count=count, block_s=block_s)
        with self._client.pipeline(transaction=False) as pipe:
            pipe.xreadgroup(**self._read_args(count, block_s))
            self._state.queue_count(pipe, self._lease_s)
            reply, counted = pipe.execute(raise_on_error=False)
        if isinstance(reply, Exception):
            raise reply
        self._counted = self._state.counted(counted, self._lease_s)
        return entries_of(reply)

    def _read_args(
        self, count: int | None, block_s: float | None, history: bool = False
    ) -> dict[str, Any]:
        """The ``xreadgroup`` arguments of a read (see ``_read``)."""
        block_ms = None if block_s is None else max(1, int(block_s * 1000))
        return {
            "groupname": CONSUMER_GROUP,
            "consumername": self.consumer,
            "streams": {self.stream: "0" if history else ">"},
            "count": count,
            "block": None if history else block_ms,
        }

    def _reclaim(self) -> None:
        """Keeps our own held entries fresh, then takes over entries idle past the lease."""
        if self._pending:
            self._client.xclaim(
                self.stream, CONSUMER_GROUP, self.consumer, 0, list(self._pending), justid=True
            )
        lease_ms = int(self._lease_s * 1000)
        for _ in range(RECLAIM_PAGES):
            idle: Any = self._client.xpending_range(
                self.stream, CONSUMER_GROUP, "-", "+", RECLAIM_PAGE, idle=lease_ms
            )
            stale = [row for row in idle if to_text(row["message_id"]) not in self._pending]
            if not stale:
                break
            # XCLAIM re-checks the idle time atomically: an entry its holder just touched stays.
            claimed: Any = self._client.xclaim(
                self.stream,
                CONSUMER_GROUP,
                self.consumer,
                lease_ms,
                [row["message_id"] for row in stale],
            )
            # Only what this claim took counts: an entry someone touched since XPENDING
            # is theirs, and its death (if any) is theirs to count.
            taken = {to_text(entry_id) for entry_id, _ in claimed}
            died_on_device = {
                to_text(row["message_id"])
                for row in stale
                if held_on_device(to_text(row["consumer"])) and to_text(row["message_id"]) in taken
            }
            log.info(
                "model %s: reclaimed %d requests past their lease (%d were on a device)",
                self.model,
                len(claimed),
                len(died_on_device),
            )
            self._take_back(claimed, died_on_device)
            if len(idle) < RECLAIM_PAGE:
                break
        self._prune_consumers(
            keys=[self.stream], args=[CONSUMER_GROUP, int(self._lease_s * 2000), self.consumer]
        )

    def _take_back(self, entries: Sequence[StreamEntry], died_on_device: set[str]) -> None:
        """Holds reclaimed entries. Those a worker held on its device when it stopped count an
        attempt (only they can have killed it); at ``max_attempts`` they are answered
        ``model_error`` instead of being run again."""
        ids = [entry_id for entry_id in died_on_device if entry_id not in self._pending]
        attempts: dict[str, int] = {}
        if ids:
            pipe = self._client.pipeline(transaction=False)
            for entry_id in ids:
                pipe.hincrby(self.keys.attempts(self.model), entry_id, 1)
            attempts = dict(zip(ids, pipe.execute(), strict=True))
        self._take(entries, attempts)

    def _take(self, entries: Sequence[StreamEntry], attempts: dict[str, int] | None = None) -> None:
        """Holds the requests read; malformed entries end as ``invalid_input`` or are dropped."""
        now_mono, now_wall = monotonic(), time.time()
        policy, pending, attempts = self.policy, self._pending, attempts or {}
        read = read_entries(entries, self.model, policy.result_ttl_s)
        refused = []
        poison = []
        max_attempts, budget = self.settings.batcher.max_attempts, policy.max_batch_cost
        aging_s = policy.priority_aging_s if policy.priorities else 0.0
        for entry_id, raw, request in read.decoded:
            if entry_id in pending:
                continue
            tries = attempts.get(entry_id, 0)
            if tries >= max_attempts:
                refused.append(poison_answer(request, entry_id, tries, policy.result_ttl_s))
                poison.append((entry_id, raw, tries))
                continue
            cost = self._cost_of(request.input)
            if budget is not None and cost > budget:
                refused.append(
                    error_answer(
                        request,
                        entry_id,
                        "invalid_input",
                        f"input costs {cost}, over the model's max_batch_cost of {budget}",
                        policy.result_ttl_s,
                    )
                )
                continue
            entry_wall_s = int(entry_id.split("-")[0]) / 1000.0
            # Positional, in the fields' order: half the time of naming them.
            pending[entry_id] = Pending(
                entry_id,
                request,
                now_mono - max(0.0, now_wall - entry_wall_s),
                now_mono + (request.deadline_at - now_wall),
                tries,
                cost,
                PRIORITY_RANK[request.priority] * aging_s,
            )
        self._writer.bury(poison)
        self._writer.finalize([*read.invalid, *refused])
        self._writer.drop(read.dropped)

    def _expire_backlog(self) -> None:
        """Answers ``expired`` for unread requests past their deadline, deleting their entries
        (nobody has read them, so nothing else holds them)."""
        last_read = next(
            (
                to_text(group["last-delivered-id"])
                for group in self._client.xinfo_groups(self.stream)
                if to_text(group["name"]) == CONSUMER_GROUP
            ),
            "0-0",
        )
        start = max((last_read, self._backlog_cursor), key=stream_id_order)
        entries: Any = self._client.xrange(self.stream, f"({start}", count=BACKLOG_SCAN_COUNT)
        at_end = len(entries) < BACKLOG_SCAN_COUNT
        self._backlog_cursor = "0-0" if at_end else to_text(entries[-1][0])
        read = read_entries(entries, self.model, self.policy.result_ttl_s)
        now = time.time()
        answers = [
            error_answer(
                request,
                entry_id,
                "expired",
                "deadline passed before the request ran",
                self.policy.result_ttl_s,
            )
            for entry_id, _, request in read.decoded
            if request.deadline_at <= now
        ]
        if answers:
            log.info("model %s: %d queued requests passed their deadline", self.model, len(answers))
        self._writer.finalize(answers)

    def _expire(self, expired: Sequence[Pending]) -> None:
        answers = [
            error_answer(
                item.request,
                item.entry_id,
                "expired",
                "deadline passed before the request ran",
                self.policy.result_ttl_s,
            )
            for item in expired
        ]
        self._writer.finalize(answers)
        for item in expired:
            self._pending.pop(item.entry_id, None)

    def _dispatch(self, batch: Sequence[Pending], reason: str | None) -> None:
        task = self._task(batch, reason)
        # While batches leave full (the stream is deep), the round trip that sends this one
        # reads the pool full again: the next one is formed without a read of its own.
        if reason in FULL_REASONS and self._piggybacks():
            self._send_with_read(task, batch)
        else:
            self._sent(task, batch, self._send(task, reason or "other"))

    def _task(self, batch: Sequence[Pending], reason: str | None) -> BatchTask:
        entries = [(item.entry_id, item.request.request_id) for item in batch]
        return BatchTask(self.model, uuid.uuid4().hex, entries, reason)

    def _sent(self, task: BatchTask, batch: Sequence[Pending], counted: Capacity) -> None:
        """Lets go of a batch sent, keeping the capacity its dispatch counted."""
        for item in batch:
            self._pending.pop(item.entry_id, None)
        self._counted = counted
        self._sending_full = task.flush_reason in FULL_REASONS
        log.debug(
            "model %s: batch %s of %d (%s)",
            self.model,
            task.batch_id,
            len(batch),
            task.flush_reason,
        )

    def _piggybacks(self) -> bool:
        """Whether a dispatch's round trip may carry other commands: on the fleet's Redis
        (not a Redis Cluster, whose pipelines take no script calls) and for batches not
        formed by cost."""
        return (
            self._broker_is_fleet_redis
            and not self.policy.batcher_chooses
            and not isinstance(self._client, redis.cluster.RedisCluster)
        )

    def _ready_for_room(self, policy: ModelPolicy) -> Plan:
        """The full batch that goes when the model has room for one more (rule 2), where its
        dispatch may wait for that room in its own round trip; an empty plan otherwise."""
        if not self._piggybacks():
            return Plan()
        return plan_batch(list(self._pending.values()), policy, monotonic(), 0, full_ahead=1)

    def _send_with_read(
        self, task: BatchTask, batch: Sequence[Pending], wait_s: float | None = None
    ) -> None:
        """Sends ``batch`` (``task``) by the dispatch script and reads the pool full again, in
        one round trip. With ``wait_s``, a wait for a slot to free (that long at most) goes
        first, and the batch is sent only if the model has room for it then (``RoomRule``,
        counted after the wait, as the step would): what a wait, the step that sends and its
        read took three round trips for. A batch without room stays pending."""
        message = batch_message(task, self.keys.celery_queue(self.model))
        rule = None
        if wait_s is not None:
            rule = RoomRule(self.settings.batcher.batches_per_worker_slot, FULL_BATCHES_AHEAD)
        # What fills the pool again once the batch has left it: none while the batcher holds
        # a batch that found no room and the batch read after it.
        refill = self._pool_size - len(self._pending) + len(batch)
        with self._client.pipeline(transaction=False) as pipe:
            if wait_s is not None:
                self._state.queue_wait(pipe, wait_s)
            dispatch = self._state.queue_dispatch(
                pipe, task.batch_id, task.flush_reason or "other", self._lease_s, message, rule
            )
            if refill > 0:
                pipe.xreadgroup(**self._read_args(refill, None))
            replies = pipe.execute(raise_on_error=False)
        woken = replies.pop(0) if wait_s is not None else None
        dispatch_reply, *read = replies
        for reply in read:  # a read that failed is left to the next step's own
            if isinstance(reply, Exception):
                log.warning("model %s: nothing read with the batch sent: %s", self.model, reply)
            else:
                self._take(entries_of(reply))
        done = dispatch(dispatch_reply)
        if done.sent:
            self._sent(task, batch, done.capacity)
        else:
            self._counted = done.capacity
        if isinstance(woken, Exception):
            raise woken

    def _send(self, task: BatchTask, reason: str) -> Capacity:
        """Records the batch in flight and sends its task; the capacity left.

        On the fleet's Redis, the dispatch script pushes the task's message in the same round
        trip; on a broker of its own, Celery sends it, and a send that fails takes the batch
        out of flight again (its requests stay pending here, for the next step).
        """
        queue = self.keys.celery_queue(self.model)
        if self._broker_is_fleet_redis:
            return self._state.dispatched(
                task.batch_id, reason, self._lease_s, batch_message(task, queue)
            )
        counted = self._state.dispatched(task.batch_id, reason, self._lease_s)
        try:
            self._celery.send_task(
                RUN_BATCH_TASK, args=task.args(), queue=queue, argsrepr=task.argsrepr()
            )
        except Exception:
            self._state.undispatched(task.batch_id)
            raise
        return counted


def run_batchers(
    settings: Settings,
    models: Sequence[str],
    stop: threading.Event,
    name: str | None = None,
    metrics_port: int | None = None,
) -> bool:
    """Runs one batcher thread per model until ``stop`` is set (and the models' metrics on
    ``metrics_port``, with their loops' health); False if one of them failed."""
    celery = make_celery_app(settings)
    consumer = name or default_batcher_name()
    batchers = [
        ModelBatcher(settings, model, client=connect(settings), celery=celery, consumer=consumer)
        for model in models
    ]
    if metrics_port is not None:
        registry = batcher_registry(connect(settings), Keys(settings.key_prefix), models)
        health = [batcher.health for batcher in batchers]
        serve_metrics(registry, metrics_port, settings.metrics_host, health)
    settle_garbage_collection()
    threads = [
        threading.Thread(target=batcher.run, args=(stop,), name=f"batcher-{batcher.model}")
        for batcher in batchers
    ]
    for batcher, thread in zip(batchers, threads, strict=True):
        thread.start()
        log.info("batcher %s serving model %s", consumer, batcher.model)
    for thread in threads:
        thread.join()
    return not any(batcher.failed for batcher in batchers)
