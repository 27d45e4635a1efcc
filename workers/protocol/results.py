"""Writing final answers: one result per request id, first write wins, waiters woken, entry acked.

The finalize script (``config/lua/finalize.lua``) is the only place a request leaves the
stream ledger. It writes the result only while the request's admission record still holds
the same digest, so a late duplicate execution can neither overwrite an answer nor bring
back one that has expired.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from collections.abc import Sequence
from operator import attrgetter
from typing import Any, NamedTuple

import redis
from redis.client import Pipeline

from config import lua, stats_fields
from config.errors import InvalidInput
from config.keys import CONSUMER_GROUP, DEVICE_CONSUMER_SUFFIX, Keys
from config.replica_wait import ReplicaWait
from config.schema import ErrorCode, ErrorInfo, Request, Result, cache_entry, output_json

DEAD_LETTER_MAXLEN = 10_000
RECENT_LATENCIES = 2000  # the answers `batchfleet top` computes latency percentiles from
# Answers per finalize script call: a batch's answers go in one call, a larger set (a backlog
# expired at once) in calls of this many.
FINALIZE_CHUNK = 1000

log = logging.getLogger(__name__)


class Answer(NamedTuple):
    """A request's final answer as the finalize script takes it, with the stream entry it
    closes: the result's JSON, the stats field counting it, its latency sample and, for an
    output a model version computed, what the response cache keeps of it (a named tuple: one
    is built per request, in a third of a frozen dataclass's time)."""

    entry_id: str
    request_id: str
    payload: str
    counted_as: str
    latency: str
    digest: str
    ttl_s: float
    cached: tuple[str, str] | None = None  # (model version, output JSON)

    @classmethod
    def of(cls, entry_id: str, result: Result, digest: str, ttl_s: float) -> Answer:
        """The answer that writes ``result``."""
        payload, counted_as = encode_answer(result)
        cached = None
        # An output that is not JSON (a set, bytes…) is answered but not cached.
        if counted_as == stats_fields.COMPLETED and result.model_version is not None:
            with contextlib.suppress(InvalidInput):
                cached = (result.model_version, output_json(result.output))
        return cls(
            entry_id=entry_id,
            request_id=result.request_id,
            payload=payload,
            counted_as=counted_as,
            latency=latency_sample(result.finished_at, result.submitted_at),
            digest=digest,
            ttl_s=ttl_s,
            cached=cached,
        )


def error_result(
    request_id: str, model: str, code: ErrorCode, message: str, **details: Any
) -> Result:
    """A final error result for ``request_id``."""
    return Result(
        request_id=request_id,
        model=model,
        error=ErrorInfo(code=code, message=message),
        finished_at=time.time(),
        **details,
    )


def error_answer(
    request: Request, entry_id: str, code: ErrorCode, message: str, ttl_s: float
) -> Answer:
    """The final error answer for a decoded request."""
    result = error_result(
        request.request_id, request.model, code, message, submitted_at=request.submitted_at
    )
    return Answer.of(entry_id, result, request.digest, ttl_s)


def poison_answer(request: Request, entry_id: str, attempts: int, ttl_s: float) -> Answer:
    """The ``poison`` answer of a request whose process died ``attempts`` times."""
    return error_answer(
        request,
        entry_id,
        "poison",
        f"the process running it died {attempts} times; moved to the dead-letter stream",
        ttl_s,
    )


def encode_answer(result: Result) -> tuple[str, str]:
    """The result's JSON and the stats field that counts it; when an output cannot be
    encoded (a lone surrogate, say), the request's answer becomes a ``model_error`` saying
    so, never a failed write."""
    try:
        payload = result.encode()
        payload.encode()
    except ValueError as exc:  # pydantic's serialiser and UTF-8 both raise ValueErrors
        fallback = error_result(
            result.request_id,
            result.model,
            "model_error",
            f"output cannot be encoded: {exc}",
            submitted_at=result.submitted_at,
        )
        return fallback.encode(), stats_fields.failed("model_error")
    if result.error is None:
        return payload, stats_fields.COMPLETED
    return payload, stats_fields.failed(result.error.code)


def latency_sample(finished_at: float, submitted_at: float | None) -> str:
    """An answer's entry in the model's list of recent latencies (``finished_at:latency``,
    read by ``batchfleet top``); '' without a submit time."""
    if submitted_at is None:
        return ""
    return f"{finished_at:.3f}:{finished_at - submitted_at:.4f}"


class ResultWriter:
    """Finalizes requests of one model in one round trip per call."""

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        model: str,
        cache_ttl_s: float | None = None,
        replica_wait: ReplicaWait | None = None,
    ) -> None:
        self._client = client
        self._replica_wait = replica_wait
        self._keys = keys
        self._model = model
        self._cache_ttl_ms = None if cache_ttl_s is None else int(cache_ttl_s * 1000)
        self._script = lua.register(client, "finalize")
        self._count_deaths = lua.register(client, "count_device_deaths")

    def pipeline(self) -> Pipeline:
        """A pipeline on the writer's client, for commands sent with its own."""
        return self._client.pipeline(transaction=False)

    def finalize(self, answers: Sequence[Answer]) -> list[str]:
        """Writes each answer; returns per item ``written``, ``duplicate`` or ``stale``."""
        if self._cache_ttl_ms is not None and answers:
            # Cached before the answers are published: a caller who sends the same input
            # again the moment its answer arrives finds it in the cache.
            pipe = self.pipeline()
            self._cache_outputs(pipe, answers)
            pipe.execute()
        statuses = []
        # One call per FINALIZE_CHUNK answers of one TTL (a model's answers share its TTL).
        for ttl_s, same_ttl in itertools.groupby(answers, key=attrgetter("ttl_s")):
            group = list(same_ttl)
            for start in range(0, len(group), FINALIZE_CHUNK):
                keys = [
                    self._keys.stream(self._model),
                    self._keys.attempts(self._model),
                    self._keys.stats(self._model),
                    self._keys.latencies(self._model),
                ]
                args: list[str | int] = [CONSUMER_GROUP, RECENT_LATENCIES, int(ttl_s * 1000)]
                for answer in group[start : start + FINALIZE_CHUNK]:
                    keys += [
                        self._keys.result(self._model, answer.request_id),
                        self._keys.record(self._model, answer.request_id),
                    ]
                    args += [answer.payload, answer.digest, answer.entry_id, answer.counted_as]
                    args.append(answer.latency)
                statuses += self._write(keys, args)
        return [status.decode() if isinstance(status, bytes) else status for status in statuses]

    def _write(self, keys: list[Any], args: list[Any]) -> list[Any]:
        """The finalize script's reply; with a replica wait, once the replicas have the
        answers. Fewer replicas in time is logged, not raised: the answers stand on the
        master, and should a failover lose them, their requests are still in the stream
        there, to be answered again."""
        if self._replica_wait is None:
            return list(lua.call(self._client, self._script, keys, args))
        reply, replicated = self._replica_wait.call(self._script, keys, args)
        if not replicated:
            log.warning("%s", self._replica_wait.unconfirmed())
        return list(reply)

    def _cache_outputs(self, pipe: Any, answers: Sequence[Answer]) -> None:
        """Adds each computed output to the model's response cache, tagged with the version
        that computed it."""
        for answer in answers:
            if answer.cached is None:
                continue
            version, output = answer.cached
            key = self._keys.cache(self._model, answer.digest)
            pipe.set(key, cache_entry(version, output), px=self._cache_ttl_ms)

    def bury(self, poison: Sequence[tuple[str, bytes | str, int]]) -> None:
        """Copies requests given up as poison (entry id, raw request, deaths) to the model's
        dead-letter stream, for an operator to inspect or replay; it keeps the newest
        ~``DEAD_LETTER_MAXLEN``."""
        if not poison:
            return
        pipe = self._client.pipeline(transaction=False)
        for entry_id, raw, deaths in poison:
            pipe.xadd(
                self._keys.dead_letter(self._model),
                {"request": raw, "entry_id": entry_id, "deaths": deaths, "at": time.time()},
                maxlen=DEAD_LETTER_MAXLEN,
                approximate=True,
            )
        pipe.execute()

    def drop(self, entry_ids: Sequence[str]) -> None:
        """Acks and deletes entries that carry no answerable request."""
        if not entry_ids:
            return
        stream = self._keys.stream(self._model)
        pipe = self._client.pipeline(transaction=False)
        pipe.xack(stream, CONSUMER_GROUP, *entry_ids)
        pipe.xdel(stream, *entry_ids)
        pipe.hdel(self._keys.attempts(self._model), *entry_ids)
        pipe.execute()

    def count_device_deaths(self, consumer: str, entry_ids: Sequence[str]) -> list[int | None]:
        """For a batch delivered again: each entry's attempts, counting one more for those on
        the device of a process that is gone, and moving them to ``consumer``; None for those
        a live process has on its device (it is running them now: leave them to it)."""
        if not entry_ids:
            return []
        counts = self._count_deaths(
            keys=[
                self._keys.stream(self._model),
                self._keys.attempts(self._model),
                self._keys.devices(self._model),
            ],
            args=[CONSUMER_GROUP, DEVICE_CONSUMER_SUFFIX, consumer, *entry_ids],
        )
        return [None if int(count) < 0 else int(count) for count in counts]

    def start_batch(
        self, batch_id: str, member: str, consumer: str, entry_ids: Sequence[str]
    ) -> list[tuple[Any, dict[Any, Any]]]:
        """Moves the batch's entries to ``consumer`` (restarting their lease) and reads them,
        and records ``member`` as running the batch, in one round trip. Returns the entries
        claimed, as ``(entry id, fields)``: only those still in the stream's ledger. A
        request with its final answer has none there: the answer's script (finalize,
        cancel) acknowledged and deleted its entry, so a batch never runs it again."""
        pipe = self.pipeline()
        if entry_ids:
            pipe.xclaim(
                self._keys.stream(self._model), CONSUMER_GROUP, consumer, 0, list(entry_ids)
            )
        pipe.hset(self._keys.inflight_owners(self._model), batch_id, member)
        replies = pipe.execute()
        claimed = replies[0] if entry_ids else []
        # Redis 7 leaves a deleted entry out; Redis 6.2 names it (None, None).
        return [entry for entry in claimed if entry[0] is not None]
