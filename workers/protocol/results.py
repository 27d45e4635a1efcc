"""Writing final answers: one result per request id, first write wins, waiters woken, entry acked.

The finalize script is the only place a request leaves the stream ledger. It writes the
result only while the request's admission record still holds the same digest, so a late
duplicate execution can neither overwrite an answer nor bring back one that has expired.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis

from config.errors import InvalidInput
from config.keys import CONSUMER_GROUP, DEVICE_CONSUMER_SUFFIX, Keys
from config.schema import ErrorCode, ErrorInfo, Request, Result, canonical_json

# KEYS: result, request record, waiters, stream, attempts hash, model's stats hash
# ARGV: result json, digest ('' = write whatever the record holds), ttl ms, group, entry id,
#       stats field counting the answer ('completed' or 'failed:{code}')
FINALIZE_SCRIPT = """
local status
local record = redis.call('GET', KEYS[2])
if ARGV[2] ~= '' and (not record or string.sub(record, 1, #ARGV[2]) ~= ARGV[2]) then
  status = 'stale'
elseif redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[3]) then
  if record then redis.call('PEXPIRE', KEYS[2], ARGV[3]) end
  for _, inbox in ipairs(redis.call('SMEMBERS', KEYS[3])) do
    redis.call('LPUSH', inbox, ARGV[1])
    redis.call('PEXPIRE', inbox, ARGV[3])
  end
  redis.call('DEL', KEYS[3])
  redis.call('HINCRBY', KEYS[6], ARGV[6], 1)
  status = 'written'
else
  status = 'duplicate'
end
if ARGV[5] ~= '' then
  redis.call('XACK', KEYS[4], ARGV[4], ARGV[5])
  redis.call('XDEL', KEYS[4], ARGV[5])
  redis.call('HDEL', KEYS[5], ARGV[5])
end
return status
"""


# KEYS: stream, attempts hash, live devices zset
# ARGV: group, device consumer suffix, claiming consumer, entry ids...
# Per entry: its attempts, counting one more when the device of a process that is gone holds
# it (that process was running it: the entry could have killed it), or -1 when a live
# process's device holds it (that process is running it now). Entries not on a live device
# move to the claiming consumer in the same step, so no one counts the same death again.
COUNT_DEVICE_DEATHS_SCRIPT = """
local t = redis.call('TIME')
local now = t[1] + t[2] / 1e6
local counts = {}
local claim = {}
for i = 4, #ARGV do
  local pending = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)[1]
  local count = tonumber(redis.call('HGET', KEYS[2], ARGV[i]) or '0')
  if pending and string.sub(pending[2], -string.len(ARGV[2])) == ARGV[2] then
    local alive_until = redis.call('ZSCORE', KEYS[3], pending[2])
    if alive_until and tonumber(alive_until) > now then
      count = -1
    else
      count = redis.call('HINCRBY', KEYS[2], ARGV[i], 1)
    end
  end
  if count >= 0 and pending then claim[#claim + 1] = ARGV[i] end
  counts[#counts + 1] = count
end
if #claim > 0 then
  redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[3], 0, unpack(claim), 'JUSTID')
end
return counts
"""


DEAD_LETTER_MAXLEN = 10_000
RECENT_LATENCIES = 2000  # the answers `batchfleet top` computes latency percentiles from


@dataclass(frozen=True)
class Final:
    """A request's final answer, with the stream entry it closes."""

    entry_id: str
    result: Result
    digest: str
    ttl_s: float


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


def error_final(
    request: Request, entry_id: str, code: ErrorCode, message: str, ttl_s: float
) -> Final:
    """The final error answer for a decoded request."""
    result = error_result(
        request.request_id, request.model, code, message, submitted_at=request.submitted_at
    )
    return Final(entry_id=entry_id, result=result, digest=request.digest, ttl_s=ttl_s)


def gave_up_final(request: Request, entry_id: str, attempts: int, ttl_s: float) -> Final:
    """The ``poison`` answer of a request whose process died ``attempts`` times."""
    return error_final(
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
        return fallback.encode(), "failed:model_error"
    return payload, "completed" if result.error is None else f"failed:{result.error.code}"


class ResultWriter:
    """Finalizes requests of one model in one round trip per call."""

    def __init__(
        self, client: redis.Redis, keys: Keys, model: str, cache_ttl_s: float | None = None
    ) -> None:
        self._client = client
        self._keys = keys
        self._model = model
        self._cache_ttl_ms = None if cache_ttl_s is None else int(cache_ttl_s * 1000)
        self._script = client.register_script(FINALIZE_SCRIPT)
        self._count_deaths = client.register_script(COUNT_DEVICE_DEATHS_SCRIPT)

    def finalize(self, finals: Sequence[Final]) -> list[str]:
        """Writes each final answer; returns per item ``written``, ``duplicate`` or ``stale``."""
        if not finals:
            return []
        pipe = self._client.pipeline(transaction=False)
        for final in finals:
            request_id = final.result.request_id
            payload, counted_as = encode_answer(final.result)
            self._script(
                keys=[
                    self._keys.result(request_id),
                    self._keys.request(request_id),
                    self._keys.waiters(request_id),
                    self._keys.requests(self._model),
                    self._keys.attempts(self._model),
                    self._keys.stats(self._model),
                ],
                args=[
                    payload,
                    final.digest,
                    int(final.ttl_s * 1000),
                    CONSUMER_GROUP,
                    final.entry_id,
                    counted_as,
                ],
                client=pipe,
            )
        if self._cache_ttl_ms is not None:
            self._cache_outputs(pipe, finals)
        recent = [
            f"{result.finished_at:.3f}:{result.finished_at - result.submitted_at:.4f}"
            for result in (final.result for final in finals)
            if result.submitted_at is not None
        ]
        if recent:
            pipe.lpush(self._keys.latencies(self._model), *recent)
            pipe.ltrim(self._keys.latencies(self._model), 0, RECENT_LATENCIES - 1)
        statuses = pipe.execute()[: len(finals)]
        return [status.decode() if isinstance(status, bytes) else status for status in statuses]

    def _cache_outputs(self, pipe: Any, finals: Sequence[Final]) -> None:
        """Adds each computed output to the model's response cache, under its version."""
        for final in finals:
            result = final.result
            if result.error is not None or result.model_version is None:
                continue
            try:
                output = canonical_json(result.output)
            except InvalidInput:
                continue  # answered model_error by encode_answer: nothing to cache
            key = self._keys.cache(self._model, result.model_version, final.digest)
            pipe.set(key, output, px=self._cache_ttl_ms)

    def bury(self, poison: Sequence[tuple[str, str, int]]) -> None:
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
        stream = self._keys.requests(self._model)
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
                self._keys.requests(self._model),
                self._keys.attempts(self._model),
                self._keys.devices(),
            ],
            args=[CONSUMER_GROUP, DEVICE_CONSUMER_SUFFIX, consumer, *entry_ids],
        )
        return [None if int(count) < 0 else int(count) for count in counts]

    def claim_and_check(
        self, consumer: str, entry_ids: Sequence[str], request_ids: Sequence[str]
    ) -> list[bool]:
        """Moves the entries to ``consumer`` (restarting their lease) and says whether each
        request already has its final answer, in one round trip."""
        pipe = self._client.pipeline(transaction=False)
        if entry_ids:
            pipe.xclaim(
                self._keys.requests(self._model),
                CONSUMER_GROUP,
                consumer,
                0,
                list(entry_ids),
                justid=True,
            )
        for request_id in request_ids:
            pipe.exists(self._keys.result(request_id))
        replies = pipe.execute()
        return [bool(found) for found in replies[1 if entry_ids else 0 :]]
