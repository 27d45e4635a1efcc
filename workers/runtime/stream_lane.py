"""The streaming lane: requests that stream their output skip the micro-batcher.

A producer appends a streaming request to ``bf:{m:MODEL}:stream_lane``; every worker serving a
model that can ``stream(item)`` reads that lane (consumer group ``streamers``) and runs each
request on its own, up to ``worker.stream_concurrency`` at once, beside its batches. Each chunk goes
to ``bf:{m:MODEL}:chunks:ID`` in order, for the caller to read; the last carries the finish
reason and usage, and the complete text is written as the request's result. A request
answered before it starts (cancelled) is dropped, one past its deadline answered
``expired``; a chunk written after the request got another answer (its caller cancelled it,
or went away) stops the stream: the model's iterator is closed, which closes its upstream
call. Each process reads the lane as its own device consumer, marked alive every heartbeat:
a stream whose process died cannot be resumed, and after the lease it is answered
``model_error``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import redis

from config.connection import REDIS_RETRY_PAUSE_S
from config.errors import WireFormatError
from config.keys import STREAM_GROUP, Keys
from config.replica_wait import ReplicaWait
from config.schema import ErrorCode, Request, Result
from config.settings import Settings
from config.stream_chunks import encode_chunk, error_chunk, last_chunk
from workers.protocol.entries import ensure_group, to_text
from workers.protocol.results import Answer, ResultWriter, error_answer

log = logging.getLogger(__name__)

READ_BLOCK_S = 1.0
CHUNKS_KEPT = 10_000


class StreamLane:
    """Serves one model's streaming requests in this worker process."""

    def __init__(
        self,
        settings: Settings,
        client: redis.Redis,
        model: str,
        stream: Callable[[Any], Iterator[dict[str, Any]]],
        consumer: str,
        version: str,
    ) -> None:
        self._settings = settings
        self._policy = settings.policy(model)
        self._client = client
        self._keys = Keys(settings.key_prefix)
        self._model = model
        self._stream = stream
        self._consumer = consumer
        self._version = version
        self._lane = self._keys.stream_lane(model)
        self._writer = ResultWriter(
            client, self._keys, model, replica_wait=ReplicaWait.of(settings)
        )
        concurrency = settings.worker.stream_concurrency
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix=f"stream-{model}")
        self._running = threading.Semaphore(concurrency)

    def start(self) -> None:
        """Opens the lane (producers may stream to the model from now on) and serves it."""
        ensure_group(self._client, self._lane, STREAM_GROUP)
        threading.Thread(target=self._run, name=f"stream-lane-{self._model}", daemon=True).start()

    def _run(self) -> None:
        """Takes one request at a time while fewer than ``stream_concurrency`` run; rides out
        Redis outages (a Redis that came back empty gets the lane again) and logs anything
        else, serving on."""
        next_reclaim = 0.0
        while True:
            try:
                if time.monotonic() >= next_reclaim:
                    self._give_up_orphans()
                    next_reclaim = time.monotonic() + self._settings.batcher.reclaim_scan_s
                self._take_one()
            except redis.ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    log.exception("stream lane of %s failed; serving on", self._model)
                    time.sleep(REDIS_RETRY_PAUSE_S)
                    continue
                with contextlib.suppress(redis.RedisError):
                    ensure_group(self._client, self._lane, STREAM_GROUP)
            except redis.RedisError as exc:
                log.warning("stream lane of %s: Redis unavailable (%s); retrying", self._model, exc)
                time.sleep(REDIS_RETRY_PAUSE_S)
            except Exception:
                log.exception("stream lane of %s failed; serving on", self._model)
                time.sleep(REDIS_RETRY_PAUSE_S)

    def _take_one(self) -> None:
        """Waits until fewer than ``stream_concurrency`` run, then hands the next request (if
        one comes within a second) to the pool."""
        self._running.acquire()
        try:
            entry = self._read()
        except BaseException:
            self._running.release()
            raise
        if entry is None:
            self._running.release()
        else:
            self._pool.submit(self._serve_then_release, *entry)

    def _read(self) -> tuple[str, str] | None:
        """The next streaming request (entry id, raw request), waiting up to a second."""
        reply: Any = self._client.xreadgroup(
            STREAM_GROUP, self._consumer, {self._lane: ">"}, count=1, block=int(READ_BLOCK_S * 1000)
        )
        for _, entries in reply or []:
            for entry_id, fields in entries:
                return to_text(entry_id), _raw_request(fields)
        return None

    def _serve_then_release(self, entry_id: str, raw: str) -> None:
        try:
            self._serve(entry_id, raw)
        except Exception:
            log.exception("stream lane of %s: request %s failed", self._model, entry_id)
        finally:
            self._running.release()

    def _serve(self, entry_id: str, raw: str) -> None:
        """Streams one request's chunks, then writes its result; stops early when the request
        was answered otherwise."""
        try:
            request = Request.decode(raw)
        except WireFormatError:
            self._done(entry_id)
            return
        if self._client.exists(self._keys.result(self._model, request.request_id)):
            self._done(entry_id)  # cancelled, or its caller went away, while it queued
            return
        if request.deadline_at <= time.time():
            self._finish(entry_id, request, error="deadline passed before it ran", code="expired")
            return
        parts: list[str] = []
        last: dict[str, Any] = {}
        stream = self._stream(request.input)
        try:
            for chunk in stream:
                if "delta" not in chunk:
                    last = chunk
                elif self._send(request, chunk, entry_id):
                    return  # answered otherwise (cancelled): closing the stream ends the call
                else:
                    parts.append(str(chunk["delta"]))
        except Exception as exc:
            self._finish(entry_id, request, error=f"{type(exc).__name__}: {exc}")
            return
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()
        self._finish(entry_id, request, output={"text": "".join(parts), **last})

    def _send(self, request: Request, chunk: dict[str, Any], entry_id: str) -> bool:
        """Appends a chunk for the caller and keeps the lane entry's lease, in one round trip;
        True when the request already has its answer (stop streaming)."""
        chunks_key = self._keys.chunks(self._model, request.request_id)
        pipe = self._client.pipeline(transaction=False)
        pipe.exists(self._keys.result(self._model, request.request_id))
        pipe.xadd(chunks_key, encode_chunk(chunk), maxlen=CHUNKS_KEPT, approximate=True)
        pipe.pexpire(chunks_key, int(self._policy.result_ttl_s * 1000))
        pipe.xclaim(self._lane, STREAM_GROUP, self._consumer, 0, [entry_id], justid=True)
        return bool(pipe.execute()[0])

    def _finish(
        self,
        entry_id: str,
        request: Request,
        output: dict[str, Any] | None = None,
        error: str | None = None,
        code: ErrorCode = "model_error",
    ) -> None:
        """Writes the request's result (first answer wins), then its last chunk, then takes
        it off the lane."""
        ttl_s = self._policy.result_ttl_s
        if error is not None:
            answer = error_answer(request, "", code, error, ttl_s)
            last = error_chunk(code, error)
        else:
            result = Result(
                request_id=request.request_id,
                model=self._model,
                model_version=self._version,
                output=output,
                batch_size=1,
                flush_reason="stream",
                submitted_at=request.submitted_at,
                finished_at=time.time(),
            )
            answer = Answer.of("", result, request.digest, ttl_s)
            last = last_chunk(output or {})
        (status,) = self._writer.finalize([answer])
        if status == "written":
            self._send(request, last, entry_id)
        self._done(entry_id)

    def _done(self, entry_id: str) -> None:
        pipe = self._client.pipeline(transaction=False)
        pipe.xack(self._lane, STREAM_GROUP, entry_id)
        pipe.xdel(self._lane, entry_id)
        pipe.execute()

    def _give_up_orphans(self) -> None:
        """Answers ``model_error`` for streams whose worker process is gone (idle past the
        lease, held by a device consumer no longer marked alive): a stream cannot resume
        where another process left it. A live process's long stream is left alone."""
        lease_ms = int(self._settings.batcher.reclaim_lease_s * 1000)
        idle: Any = self._client.xpending_range(
            self._lane, STREAM_GROUP, "-", "+", 100, idle=lease_ms
        )
        if not idle:
            return
        seconds, micros = self._client.time()
        now = seconds + micros / 1e6
        pipe = self._client.pipeline(transaction=False)
        for row in idle:
            pipe.zscore(self._keys.devices(self._model), row["consumer"])
        alive_until = pipe.execute()
        gone = [
            row["message_id"]
            for row, until in zip(idle, alive_until, strict=True)
            if until is None or float(until) <= now
        ]
        if not gone:
            return
        claimed: Any = self._client.xclaim(self._lane, STREAM_GROUP, self._consumer, lease_ms, gone)
        for entry_id, fields in claimed:
            try:
                request = Request.decode(_raw_request(fields))
            except WireFormatError:
                self._done(to_text(entry_id))
                continue
            message = "the worker streaming it stopped; a stream cannot resume"
            self._finish(to_text(entry_id), request, error=message)


def _raw_request(fields: dict[Any, Any]) -> str:
    return to_text(fields.get(b"request", fields.get("request", b"")))
