"""The worker process's one device: who holds it, what Redis knows is on it, and model calls.

One device per process: batch slots overlap decoding and answer writing, never model work,
so the next batch is ready the moment the device frees. While a model call runs, its requests
belong to this process's device consumer in the stream, so a process that dies in that call is
found holding exactly what was on its device.

A batch done with the device, when the batch waiting for it only sends its claim (it is full)
and starts its model at once, stays out of the interpreter until that claim is sent: it sleeps
``HAND_OVER_YIELD_S``, then looks every ``HAND_OVER_POLL_S``, ``HAND_OVER_WAIT_S`` at most.
One interpreter runs every slot, and the finished batch's answers, built at once, took it from
that claim each time the claim's socket calls let it go, while the device idled. A claim that
reads late joiners waits for Redis's reply, which leaves the interpreter to the answers
meanwhile. The claim does not wake the finished batch: woken so, its thread took the claiming
thread's core for ~0.2 ms on a 2-core host (``benchmarks/README.md``).

A batch waiting for the device readies its claim ahead, ``READ_AHEAD_S`` before the running
model call is expected to end (the mean of this process's calls of that model and size,
``MeasuredModelTimes.expected_s``): with room for late joiners, it reads them then, so that
when the device frees its claim is only sent and its model starts at once, instead of a round
trip later; and it takes the claim's connection from the pool and packs its XCLAIM, which cost
a process woken from a slow model's call (tens of milliseconds asleep) ~0.3 ms, most of the
device's idle time between two calls (``benchmarks/README.md``). A read ahead that has grown
stale by then (the call ran long) is topped up by a read in the claim, as without one.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import redis
from celery.exceptions import SoftTimeLimitExceeded
from redis.crc import key_slot

from config.connection import Replies, TakenConnection, send_now
from config.keys import CONSUMER_GROUP
from config.schema import Request
from config.settings import Settings
from workers.models.base import Model, postprocess_of
from workers.protocol.batch_cap import BatchCap, is_out_of_memory
from workers.protocol.capacity import SlotRelease
from workers.protocol.entries import StreamEntry, entries_of
from workers.protocol.model_times import MeasuredModelTimes
from workers.runtime.gpu import GpuTelemetry

Runnable = tuple[str, Request]
"""A request to run: its stream entry id and the request."""

# How a batch done with the device waits for a full batch's claim of it (see the module's
# docstring): a first sleep, about what the claim takes to be sent, then a look every poll,
# for the wait at most.
HAND_OVER_YIELD_S = 0.0002
HAND_OVER_POLL_S = 0.0001
HAND_OVER_WAIT_S = 0.002

# How long before the running model call's expected end a batch waiting for the device reads
# its late joiners (a read's round trip under load, ~0.4 ms, and the call's own jitter: at
# 0.5 ms the reply came back after the device had freed in most hand-overs), how old that read
# may be when the device frees before the claim reads again, and how often a waiting batch
# looks whether the call it waits on has started.
READ_AHEAD_S = 0.0008
READ_AHEAD_FRESH_S = 0.001
CALL_START_POLL_S = 0.0005

log = logging.getLogger(__name__)


def reads_late_joiners(runnables: Sequence[Runnable], fill_to: int) -> bool:
    """Whether a claim of ``runnables`` topped up to ``fill_to`` reads late joiners, and so
    waits for Redis's reply (``Device.claim``); otherwise it is only sent."""
    return fill_to > len(runnables)


@dataclass(frozen=True)
class ReadyClaim:
    """A claim only sent, readied before the device frees (``Device.ready_claim``): the
    entries it moves, and its XCLAIM packed on a connection taken from the pool."""

    ids: list[str]
    command: tuple[Any, ...]
    packed: list[bytes]
    connection: TakenConnection

    def send(self, releases: Sequence[tuple[Any, ...]]) -> Replies:
        """Sends the claim with ``releases`` (commands on its node) after it."""
        packed = [*self.packed, *self.connection.pack(releases)] if releases else self.packed
        return self.connection.send([self.command, *releases], packed)


class ClaimAhead:
    """What a batch waiting for the device does before it frees (``Device.held``): reads its
    late joiners with ``read`` (given room for them; a failed read leaves them to the claim),
    then readies its claim of them all with ``ready``. ``give_back`` gives the connection
    of a claim readied and not sent back to the pool."""

    def __init__(
        self,
        read: Callable[[], list[Runnable]] | None,
        ready: Callable[[list[Runnable]], ReadyClaim | None],
    ) -> None:
        self._read = read
        self._ready = ready
        self.runnables: list[Runnable] = []
        self.claim: ReadyClaim | None = None
        self._read_at: float | None = None

    def __call__(self) -> None:
        if self._read is not None:
            try:
                self.runnables = self._read()
            except redis.RedisError as exc:
                log.warning("late joiners not read ahead: %s", exc)
                return
        self._read_at = time.monotonic()
        try:
            self.claim = self._ready(self.runnables)
        except redis.RedisError as exc:  # the claim takes a connection when the device frees
            log.warning("claim not readied ahead: %s", exc)

    def fresh(self) -> bool:
        """Whether late joiners were read ahead within ``READ_AHEAD_FRESH_S``."""
        read_at = self._read_at
        return read_at is not None and time.monotonic() - read_at <= READ_AHEAD_FRESH_S

    def give_back(self) -> None:
        """Gives the connection of the claim readied back, unless the claim was sent."""
        if self.claim is not None:
            self.claim.connection.give_back()


class GpuMemoryLow(Exception):
    """The GPU had too little memory free to start a batch: it runs in halves."""


@dataclass(frozen=True)
class ModelRun:
    """One ``predict`` call over ``runnables``: their outputs, or the error all of them share.
    A model that postprocesses has what its device ``computed`` instead, until
    ``postprocessed`` makes the outputs of it."""

    runnables: list[Runnable]
    outputs: list[Any]
    error: str | None
    model_s: float
    finished_at: float
    computed: Any = None


class Device:
    """The device lock, the device consumer that holds what runs, and timed model calls."""

    def __init__(
        self,
        settings: Settings,
        client: redis.Redis,
        gpu: GpuTelemetry,
        consumer: str,
        times: MeasuredModelTimes,
    ) -> None:
        self._lock = threading.RLock()
        self.consumer = consumer
        self._settings = settings
        self._client = client
        self._gpu = gpu
        self._busy_since: float | None = None
        self._busy_until: float | None = None  # the call's expected end; inf when unknown
        self._times = times
        self._waiting = 0
        self._waiting_to_send = 0  # of those, the threads whose claims are only sent
        self._claimed = True  # whether the holder has claimed the device since it was handed
        self._counting = threading.Lock()
        self._handed: list[SlotRelease] = []
        self._depth = 0  # the holder's nested holds

    @contextlib.contextmanager
    def held(
        self, reads_late_joiners: bool = False, ahead: ClaimAhead | None = None
    ) -> Iterator[None]:
        """Holds the device lock; the thread counts as waiting for the device until it has
        it (see ``hand_over``). Whoever takes the device claims before anything else: with
        ``reads_late_joiners``, a claim that waits for Redis's reply (the function of that
        name), otherwise one only sent. With ``ahead``, a thread that waits calls it
        ``READ_AHEAD_S`` before the running call is expected to end (see the module's
        docstring). Letting the device go while a thread whose claim is only sent waits for
        it returns once the next holder has claimed it (see the module's docstring)."""
        with self._counting:
            self._waiting += 1
            self._waiting_to_send += not reads_late_joiners
        try:
            if ahead is None:
                self._lock.acquire()
            else:
                self._acquire_ahead(ahead)
        finally:
            with self._counting:
                self._waiting -= 1
                self._waiting_to_send -= not reads_late_joiners
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            with self._counting:
                handing_over = self._depth == 0 and self._waiting_to_send > 0
            if handing_over:
                self._claimed = False
            self._lock.release()
            if handing_over:
                self._await_claim()

    def _acquire_ahead(self, ahead: ClaimAhead) -> None:
        """Takes the lock; should the running call come within ``READ_AHEAD_S`` of its
        expected end first, calls ``ahead`` once, then waits on. A call whose end is not
        expected (no call of its model and size measured yet) is waited out."""
        while True:
            until = self._busy_until
            if until == math.inf:
                self._lock.acquire()
                return
            wait = CALL_START_POLL_S if until is None else until - READ_AHEAD_S - time.monotonic()
            if wait <= 0:
                ahead()
                self._lock.acquire()
                return
            if self._lock.acquire(timeout=wait):
                return

    def read_late_joiners(self, stream: str, consumer: str, count: int) -> list[StreamEntry]:
        """Takes up to ``count`` requests no batcher has read yet for ``consumer`` (a read
        ahead: the claim moves them to the device consumer)."""
        return entries_of(
            self._client.xreadgroup(CONSUMER_GROUP, consumer, {stream: ">"}, count=count)
        )

    def _await_claim(self) -> None:
        """Sleeps until the next holder has claimed the device, ``HAND_OVER_WAIT_S`` at most
        (see the module's docstring)."""
        deadline = time.monotonic() + HAND_OVER_WAIT_S
        time.sleep(HAND_OVER_YIELD_S)
        while not self._claimed and time.monotonic() < deadline:
            time.sleep(HAND_OVER_POLL_S)

    def hand_over(self, release: SlotRelease) -> bool:
        """Called, holding the device, by a batch done with it. When another batch waits for
        the device (of any model this process serves), the finished batch's slot
        ``release`` is sent by that batch's claim once its read of late joiners returns: a
        batcher woken by the release cannot take them from it first. False when none waits:
        the caller sends it."""
        if self.waiting == 0:
            return False
        self._handed.append(release)
        return True

    @property
    def waiting(self) -> int:
        """How many threads wait for the device (a batch each, decoded and started)."""
        with self._counting:
            return self._waiting

    def busy_s(self) -> float:
        """How long the device has been held by the current model call; 0 when it is free."""
        since = self._busy_since
        return 0.0 if since is None else time.monotonic() - since

    def memory_low(self) -> bool:
        """Whether the pinned GPU's latest reading has less free memory than a batch needs
        to start (``worker.gpu_min_free_mb``); False without a reading."""
        reading = self._gpu.latest
        reserve = self._settings.worker.gpu_min_free_mb * 2**20
        return reading is not None and reading.memory_free_bytes < reserve

    def ready_claim(self, stream: str, runnables: Sequence[Runnable]) -> ReadyClaim | None:
        """The claim of ``runnables`` (none without them), readied for ``claim`` to send (see
        the module's docstring)."""
        ids = [entry_id for entry_id, _ in runnables]
        if not ids:
            return None
        command = ("XCLAIM", stream, CONSUMER_GROUP, self.consumer, 0, *ids, "JUSTID")
        connection = TakenConnection(self._client, stream)
        return ReadyClaim(ids, command, connection.pack([command]), connection)

    def claim(
        self,
        stream: str,
        runnables: Sequence[Runnable],
        fill_to: int = 0,
        ready: ReadyClaim | None = None,
    ) -> tuple[list[StreamEntry], Callable[[], None]]:
        """Moves ``runnables`` to the device consumer, restarting their lease, for the model
        call the caller makes next (holding the device), and sends what a batch done with the
        device handed over (``hand_over``). A claim only sent goes out as ``ready`` where
        that was readied for the same requests (``ready_claim``); a ``ready`` it does not send
        gives its connection back here (the caller's ``ClaimAhead.give_back`` covers a claim
        never passed on).

        With ``fill_to`` it also takes requests no batcher has read yet, up to that batch
        size (late binding), in the same round trip, and returns them; what was handed over
        is sent once that read returns, not in its round trip (the batcher it wakes would
        delay the reply). With nothing to take, the claim is only sent, so the model starts
        at once, with the releases of its own model. Each other release goes to its own
        model's node. The returned ``confirm`` reads the replies of what was only sent, to
        be called once the device is released, whatever happened. Returning, or failing, it
        lets the batch that handed the device over go on.
        """
        handed, self._handed = self._handed, []
        try:
            arrived, sent = self._claim(stream, runnables, fill_to, handed, ready)
        except BaseException:
            for release in handed:  # a finished batch's slot must not wait for its lease
                with contextlib.suppress(redis.RedisError):
                    release.send(self._client)()
            raise
        finally:
            self._claimed = True
        return arrived, partial(read_each, sent) if sent else nothing_to_read

    def _claim(
        self,
        stream: str,
        runnables: Sequence[Runnable],
        fill_to: int,
        handed: Sequence[SlotRelease],
        ready: ReadyClaim | None,
    ) -> tuple[list[StreamEntry], list[Replies]]:
        """The late joiners, and the replies still to read of what was only sent."""
        ids: list[Any] = [entry_id for entry_id, _ in runnables]
        if ready is not None and (ready.ids != ids or reads_late_joiners(runnables, fill_to)):
            ready.connection.give_back()  # readied for other requests, or a read goes first
            ready = None
        if reads_late_joiners(runnables, fill_to):
            room = fill_to - len(runnables)
            pipe = self._client.pipeline(transaction=False)
            if ids:
                pipe.xclaim(stream, CONSUMER_GROUP, self.consumer, 0, ids, justid=True)
            pipe.xreadgroup(CONSUMER_GROUP, self.consumer, {stream: ">"}, count=room)
            arrived = entries_of(pipe.execute()[-1])
            return arrived, [release.send(self._client) for release in handed]
        releases: list[tuple[Any, ...]] = []
        apart = []
        slot = key_slot(stream.encode()) if handed else None
        for release in handed:  # the claim carries those of its own hash slot
            if key_slot(release.key.encode()) == slot:
                releases.extend(release.commands)
            else:
                apart.append(release)
        if ready is None:
            ready = self.ready_claim(stream, runnables)
        if ready is not None:
            sent = [ready.send(releases)]
        else:
            sent = [send_now(self._client, stream, *releases)] if releases else []
        sent += [release.send(self._client) for release in apart]
        return [], sent

    def timed(self, name: str, model: Model, cap: BatchCap) -> Callable[[list[Any]], Any]:
        """``model.predict`` for one batch and its bisection, with ``busy_s`` telling the
        watchdog how long each call has been running, a batch waiting for the device when
        it is expected to end (the mean of the model ``name``'s calls of that size, see
        ``held``), and the model's batch cap told of
        successes and of the first out-of-memory error (the bisection's later ones are its own
        halves). A batch that would start with too little GPU memory free runs in halves; the
        shared cap is left alone (another process's memory, or a framework's cache, says
        nothing about what the model needs)."""
        lowered = checked = False

        def predict(inputs: list[Any]) -> Any:
            nonlocal lowered, checked
            if not checked:
                checked = True
                if len(inputs) > 1 and self.memory_low():
                    raise GpuMemoryLow(
                        f"under {self._settings.worker.gpu_min_free_mb} MiB of GPU memory free"
                    )
            started = time.monotonic()
            mean = self._times.expected_s(name, len(inputs))
            self._busy_until = math.inf if mean is None else started + mean
            self._busy_since = started
            try:
                outputs = model.predict(inputs)
            except Exception as exc:
                if not lowered and is_out_of_memory(exc):
                    lowered = True
                    cap.out_of_memory(len(inputs))
                raise
            finally:
                self._busy_since = self._busy_until = None
            cap.succeeded(len(inputs))
            return outputs

        return predict


def isolate_failures(
    predict: Callable[[list[Any]], Any], runnables: list[Runnable], postprocesses: bool = False
) -> list[ModelRun]:
    """Runs ``runnables`` through ``predict`` (the caller holds the device); a failing group
    is halved and retried until each failure is pinned on single inputs. A soft time limit is
    not retried: it fails the group. For a model that ``postprocesses``, each run holds what
    ``predict`` returned (``computed``), for ``postprocessed`` to turn into outputs once the
    device is free."""
    started = time.monotonic()
    try:
        computed = predict([request.input for _, request in runnables])
        outputs = [] if postprocesses else counted_outputs(computed, runnables)
    except Exception as exc:
        if len(runnables) == 1 or isinstance(exc, SoftTimeLimitExceeded):
            return [failed_run(runnables, exc, time.monotonic() - started, time.time())]
        middle = len(runnables) // 2
        return isolate_failures(predict, runnables[:middle], postprocesses) + isolate_failures(
            predict, runnables[middle:], postprocesses
        )
    kept = computed if postprocesses else None
    return [ModelRun(runnables, outputs, None, time.monotonic() - started, time.time(), kept)]


def postprocessed(model: Model, runs: list[ModelRun]) -> list[ModelRun]:
    """``model``'s ``runs`` with what the device computed turned into their outputs by its
    ``postprocess``, after the device is free (``runs`` as they are for a model without
    one). A run whose ``postprocess`` raises, or returns another count of outputs, fails
    whole."""
    postprocess = postprocess_of(model)
    if postprocess is None:
        return runs
    finished = []
    for run in runs:
        if run.error is None:
            try:
                outputs = counted_outputs(postprocess(run.computed), run.runnables)
                run = replace(run, outputs=outputs, computed=None)
            except Exception as exc:
                run = failed_run(run.runnables, exc, run.model_s, run.finished_at)
        finished.append(run)
    return finished


def counted_outputs(outputs: Sequence[Any], runnables: list[Runnable]) -> list[Any]:
    """``outputs`` as a list, one per runnable.

    Raises:
        ValueError: the model returned another count of outputs.
    """
    counted = list(outputs)
    if len(counted) != len(runnables):
        raise ValueError(f"model returned {len(counted)} outputs for {len(runnables)} inputs")
    return counted


def failed_run(
    runnables: list[Runnable], exc: Exception, model_s: float, finished_at: float
) -> ModelRun:
    """A model run that failed with ``exc`` for every one of ``runnables``."""
    message = f"{type(exc).__name__}: {exc}"
    return ModelRun(runnables, [None] * len(runnables), message, model_s, finished_at)


def nothing_to_read() -> None:
    """A confirmation with nothing to confirm (or a reply already read)."""


def read_each(confirmations: Sequence[Callable[[], object]]) -> None:
    """Calls every one of ``confirmations`` (each gives its connection back), even after one
    raised; raises the first error once all are read."""
    failed: list[redis.RedisError] = []
    for confirm in confirmations:
        try:
            confirm()
        except redis.RedisError as exc:
            failed.append(exc)
    if failed:
        raise failed[0]
