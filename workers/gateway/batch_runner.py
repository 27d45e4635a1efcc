"""Runs the fleet's Batch API jobs from this gateway. It looks for jobs that have not ended
(at start, when this gateway creates one, and six times per lease period), takes the lease
of each that no live gateway holds, and runs it through the bulk-job machinery in a thread
of its own, renewing the lease meanwhile. A job whose gateway died is resumed by the next
one to look: its lines already answered are skipped and its requests still in the fleet
are waited for, never run twice (``workers.tools.bulk``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.exceptions import LockError
from redis.lock import Lock

from config.errors import BrokerUnavailable
from config.settings import Settings
from producer.client import Producer
from workers.gateway.batch_lines import OpenAILines, check_input
from workers.gateway.batch_store import BatchStore
from workers.gateway.files import FileStore
from workers.tools.bulk import BulkReport, JobOptions, run_file

log = logging.getLogger(__name__)

# Looks for free jobs this many times per lease (every 5 s at the default 30 s lease).
SCANS_PER_LEASE = 6
# Renews a lease this many times per lease period.
RENEWALS_PER_LEASE = 3
PROGRESS_EVERY_S = 0.5
# At shutdown, how long running jobs get to finish their wave before the process leaves them
# to a resume.
STOP_WAIT_S = 10.0


@dataclass
class RunningJob:
    """A job this gateway runs: ``stop`` asks its thread to end after its wave, ``done`` is
    set when it has, and ``renewal`` keeps its lease."""

    stop: threading.Event = field(default_factory=threading.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    renewal: asyncio.Task[None] | None = None


class BatchRunner:
    """This gateway's share of the fleet's Batch API jobs."""

    def __init__(self, settings: Settings, store: BatchStore, files: FileStore) -> None:
        self._settings = settings
        self._store = store
        self._files = files
        self._wake = asyncio.Event()
        self._running: dict[str, RunningJob] = {}
        self._serving: asyncio.Task[None] | None = None
        self._stopping = False

    def wake(self) -> None:
        """Looks for jobs now (one was just created)."""
        self._wake.set()

    def start(self) -> None:
        """Starts taking and running jobs, in a task on the running loop, until ``aclose``."""
        self._serving = asyncio.create_task(self._serve(), name="batch-runner")

    async def aclose(self) -> None:
        """Stops taking jobs and waits while the running ones are asked to stop (up to
        ``STOP_WAIT_S``). It cancels the loop, which also ends at its next turn by itself: on
        Python 3.11 ``asyncio.wait_for`` drops a cancellation that comes as the wake-up it
        waits for does (python/cpython#86296), and the loop would take jobs on forever."""
        self._stopping = True
        self._wake.set()
        if self._serving is None:
            return
        self._serving.cancel()
        await asyncio.wait([self._serving])
        with contextlib.suppress(asyncio.CancelledError):
            self._serving.result()

    async def _serve(self) -> None:
        """Takes and runs jobs until stopped or cancelled; then asks the running ones to
        stop."""
        try:
            while not self._stopping:
                try:
                    await self._take_free_jobs()
                except redis.RedisError as exc:
                    log.warning("batch jobs: Redis unavailable (%s); looking again later", exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self._store.lease_s / SCANS_PER_LEASE)
                self._wake.clear()
        finally:
            for job in self._running.values():
                job.stop.set()
            waits = [job.done.wait() for job in self._running.values()]
            if waits:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.gather(*waits), STOP_WAIT_S)

    async def _take_free_jobs(self) -> None:
        for batch_id in await asyncio.to_thread(self._store.active_ids):
            if batch_id in self._running:
                continue
            lease = self._store.lease(batch_id)
            if await asyncio.to_thread(lease.acquire, blocking=False):
                job = self._running[batch_id] = RunningJob()
                loop = asyncio.get_running_loop()
                thread = threading.Thread(
                    target=self._run_in_thread,
                    args=(batch_id, job, loop),
                    name=f"batch {batch_id}",
                    daemon=True,
                )
                thread.start()
                job.renewal = asyncio.create_task(self._renew(batch_id, lease, job))

    def _run_in_thread(
        self, batch_id: str, job: RunningJob, loop: asyncio.AbstractEventLoop
    ) -> None:
        try:
            run_job(self._settings, self._store, self._files, batch_id, job.stop)
        except (BrokerUnavailable, redis.RedisError) as exc:
            log.warning("batch %s: Redis unavailable (%s); a later run resumes it", batch_id, exc)
        except Exception as exc:
            log.exception("batch %s failed", batch_id)
            error = {"code": "batch_failed", "message": f"{type(exc).__name__}: {exc}"}
            with contextlib.suppress(redis.RedisError):
                self._store.update(batch_id, errors={"object": "list", "data": [error]})
                self._store.stamp(batch_id, "failed")
        finally:
            loop.call_soon_threadsafe(job.done.set)

    async def _renew(self, batch_id: str, lease: Lock, job: RunningJob) -> None:
        """Renews the lease while the job runs; a lease lost stops the job after its wave."""
        try:
            while not job.done.is_set():
                with contextlib.suppress(TimeoutError):
                    renew_s = self._store.lease_s / RENEWALS_PER_LEASE
                    await asyncio.wait_for(job.done.wait(), renew_s)
                if not job.done.is_set():
                    await asyncio.to_thread(lease.reacquire)
        except (LockError, redis.RedisError) as exc:
            log.warning("batch %s: lost its lease (%s); stopping after this wave", batch_id, exc)
            job.stop.set()
            await job.done.wait()
        finally:
            self._running.pop(batch_id, None)
            with contextlib.suppress(LockError, redis.RedisError):
                await asyncio.to_thread(lease.release)


def _counts(report: BulkReport) -> dict[str, int]:
    failed = sum(report.errors.values()) + report.errors_earlier
    completed = report.written + report.skipped - report.errors_earlier
    return {"completed": completed, "failed": failed}


def run_job(
    settings: Settings, store: BatchStore, files: FileStore, batch_id: str, stop: threading.Event
) -> None:
    """Runs (or resumes) one job to its end, unless ``stop`` is set first (then it stays
    active for the next run)."""
    job = store.get(batch_id)
    if job is None:
        return
    source = files.path(job["input_file_id"])
    if job["status"] == "validating":
        total, problems = check_input(source, job["endpoint"], job["model"])
        if problems:
            store.update(batch_id, errors={"object": "list", "data": problems}, total=total)
            store.stamp(batch_id, "failed")
            return
        store.update(batch_id, total=total)
        store.stamp(batch_id, "in_progress")

    def cancelled() -> bool:
        return store.status(batch_id) == "cancelling"

    last_progress = 0.0

    def on_progress(report: BulkReport) -> None:
        nonlocal last_progress
        if time.monotonic() - last_progress >= PROGRESS_EVERY_S:
            last_progress = time.monotonic()
            store.update(batch_id, **_counts(report))

    options = JobOptions(
        job_id=batch_id,
        expires_at=float(job["expires_at"]),
        line_format=OpenAILines(job["endpoint"], job["model"]),
        keep_going=lambda: not stop.is_set() and not cancelled(),
        # Cancelled while no gateway ran it: end what the last runner had sent.
        wind_down=job["status"] == "cancelling",
    )
    output, errors = files.path(job["work_output"]), files.path(job["work_errors"])
    with Producer(settings) as producer:
        report = run_file(producer, job["model"], source, output, errors, options, on_progress)
    store.update(batch_id, **_counts(report))
    if stop.is_set() and not cancelled():
        return
    ending = "cancelled" if cancelled() else "expired" if report.expired else "completed"
    _finish(store, files, batch_id, job, ending)


def _finish(
    store: BatchStore, files: FileStore, batch_id: str, job: dict[str, Any], ending: str
) -> None:
    """Makes the job's output and error lines files, and ends it ``ending``."""
    store.stamp(batch_id, "finalizing")
    ended: dict[str, str] = {}
    for work, name, suffix in (
        ("work_output", "output_file_id", "output"),
        ("work_errors", "error_file_id", "errors"),
    ):
        path = files.path(job[work])
        path.touch()
        if name == "output_file_id" or path.stat().st_size:
            files.register(job[work], f"{batch_id}_{suffix}.jsonl", "batch_output")
            ended[name] = job[work]
    store.update(batch_id, **ended)
    store.stamp(batch_id, ending)
