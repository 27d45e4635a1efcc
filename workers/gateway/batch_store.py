"""The Batch API's jobs in Redis (``bf:gw:batch:ID``, listed in ``bf:gw:batches``): each job
is a hash of its OpenAI batch object's fields, so any gateway of the fleet can answer for it,
cancel it, or resume it. A job's runner holds its lease (``bf:gw:lease:ID``, redis-py's
``Lock``, ``gateway.batch_lease_s``) and renews it while it runs."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

import redis
from redis.lock import Lock

from config.keys import Keys

ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
# Fields stored as JSON (the rest are strings, or integers for times and counts). A job also
# keeps the ids its output and error files will have (work_output, work_errors); they become
# output_file_id and error_file_id when the job ends.
JSON_FIELDS = ("errors", "metadata")
COUNTS = ("total", "completed", "failed")
TIMES = (
    "created_at",
    "in_progress_at",
    "expires_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelling_at",
    "cancelled_at",
)
OPTIONAL = ("output_file_id", "error_file_id")


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def _job(raw: Mapping[Any, Any]) -> dict[str, str] | None:
    """A job read from its hash; None for a hash that is gone."""
    return {_text(key): _text(value) for key, value in raw.items()} if raw else None


def _encoded(fields: Mapping[str, Any]) -> Mapping[Any, str | int]:
    return {
        name: json.dumps(value) if name in JSON_FIELDS else value for name, value in fields.items()
    }


class BatchStore:
    """Reads and writes jobs; every call is one or two Redis commands."""

    def __init__(self, client: redis.Redis, keys: Keys, lease_s: float) -> None:
        self._client = client
        self._keys = keys
        self.lease_s = lease_s

    def create(self, job: dict[str, Any]) -> None:
        fields = {name: value for name, value in job.items() if value is not None}
        with self._client.pipeline() as pipe:
            pipe.hset(self._keys.gateway_batch(job["id"]), mapping=_encoded(fields))
            # Scored to the microsecond (created_at has whole seconds): listed in the order
            # they were made.
            pipe.zadd(self._keys.gateway_batches(), {job["id"]: time.time()})
            pipe.execute()

    def get(self, batch_id: str) -> dict[str, str] | None:
        return _job(self._client.hgetall(self._keys.gateway_batch(batch_id)))

    def status(self, batch_id: str) -> str | None:
        """A job's status; None for no such job."""
        raw = self._client.hget(self._keys.gateway_batch(batch_id), "status")
        return None if raw is None else _text(raw)

    def update(self, batch_id: str, **fields: Any) -> None:
        self._client.hset(self._keys.gateway_batch(batch_id), mapping=_encoded(fields))

    def stamp(self, batch_id: str, status: str) -> None:
        """Moves a job to ``status``, noting when (``STATUS_at``)."""
        at = f"{status}_at"
        self.update(batch_id, status=status, **({at: int(time.time())} if at in TIMES else {}))

    def cancel(self, batch_id: str) -> bool:
        """Asks a job's runner to stop (status ``cancelling``); False if it already ended."""
        job = self.get(batch_id)
        if job is None or job["status"] not in ACTIVE:
            return False
        if job["status"] != "cancelling":
            self.stamp(batch_id, "cancelling")
        return True

    def active_ids(self) -> list[str]:
        """The jobs that have not ended, oldest first."""
        ids = [_text(raw) for raw in self._client.zrange(self._keys.gateway_batches(), 0, -1)]
        with self._client.pipeline(transaction=False) as pipe:
            for batch_id in ids:
                pipe.hget(self._keys.gateway_batch(batch_id), "status")
            statuses = pipe.execute()
        return [
            batch_id
            for batch_id, status in zip(ids, statuses, strict=True)
            if status is not None and _text(status) in ACTIVE
        ]

    def listed(self, limit: int, after: str | None = None) -> tuple[list[dict[str, str]], bool]:
        """Up to ``limit`` jobs, newest first, from the one after job ``after``; and whether
        more follow.

        Raises:
            LookupError: ``after`` names no job.
        """
        key = self._keys.gateway_batches()
        start = 0
        if after is not None:
            rank: Any = self._client.zrevrank(key, after)
            if rank is None:
                raise LookupError(after)
            start = rank + 1
        ids = self._client.zrevrange(key, start, start + limit)  # one more: do more follow?
        with self._client.pipeline(transaction=False) as pipe:
            for raw in ids[:limit]:
                pipe.hgetall(self._keys.gateway_batch(_text(raw)))
            jobs = [_job(raw) for raw in pipe.execute()]
        return [job for job in jobs if job is not None], len(ids) > limit

    def lease(self, batch_id: str) -> Lock:
        """The job's lease (not taken yet: ``acquire(blocking=False)``, then ``reacquire()``
        to renew)."""
        lease: Lock = self._client.lock(
            self._keys.gateway_batch_lease(batch_id), timeout=self.lease_s, thread_local=False
        )
        return lease


def batch_object(job: dict[str, str]) -> dict[str, Any]:
    """A job's OpenAI batch object."""
    obj: dict[str, Any] = {
        "id": job["id"],
        "object": "batch",
        "endpoint": job["endpoint"],
        "input_file_id": job["input_file_id"],
        "completion_window": job["completion_window"],
        "status": job["status"],
        "errors": json.loads(job["errors"]) if "errors" in job else None,
        "metadata": json.loads(job["metadata"]) if "metadata" in job else None,
        "request_counts": {name: int(job.get(name, 0)) for name in COUNTS},
    }
    obj.update({name: int(job[name]) if name in job else None for name in TIMES})
    obj.update({name: job.get(name) for name in OPTIONAL})
    return obj
