"""The batch task: run one micro-batch through its model and finalize every request in it."""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis
from celery import Celery, Task
from celery.exceptions import SoftTimeLimitExceeded

from config.connection import connect
from config.errors import InvalidInput
from config.keys import CONSUMER_GROUP, Keys, device_consumer, worker_consumer
from config.schema import STREAM_FIELD, ErrorCode, Request, Result, canonical_json
from config.settings import Settings
from workers.models.base import ItemError, Model
from workers.models.registry import build_model
from workers.protocol.batch_cap import BatchCap, is_out_of_memory
from workers.protocol.capacity import (
    FleetState,
    GpuClaim,
    NodeBeat,
    node_heartbeat,
    slots_of,
    worker_member,
)
from workers.protocol.celery_app import RUN_BATCH_TASK
from workers.protocol.entries import StreamEntry, read_entries
from workers.protocol.model_times import MeasuredModelTimes
from workers.protocol.results import Final, ResultWriter, error_final, gave_up_final
from workers.runtime.alerts import WorkerAlerts
from workers.runtime.gpu import GpuTelemetry
from workers.runtime.metrics import WorkerMetrics
from workers.runtime.stream_lane import StreamLane

log = logging.getLogger(__name__)

EXIT_GPU_LOST = 71


class WorkerRuntime:
    """What one worker process holds: its models (loaded once), its Redis client, its name."""

    def __init__(
        self,
        settings: Settings,
        hostname: str,
        device: str,
        models: Sequence[str],
        client: redis.Redis | None = None,
        gpu: int | None = None,
        gpu_claim: GpuClaim | None = None,
    ) -> None:
        self.settings = settings
        self.hostname = hostname
        self.device = device
        self.model_names = list(models)
        self.gpu = GpuTelemetry(gpu)
        self.gpu_claim = gpu_claim
        self.metrics = WorkerMetrics(self.gpu, hostname, models)
        self.work = WorkDone()
        self.model_times = MeasuredModelTimes()
        self.alerts = WorkerAlerts(settings.alerts, hostname, started_at=time.time())
        self.keys = Keys(settings.key_prefix)
        self.client = client or connect(settings)
        self._models: dict[str, Model] = {}
        self._caps: dict[str, BatchCap] = {}
        self._load_lock = threading.Lock()
        # One device per process: batch slots overlap decoding and result writing, never
        # model work, so the next batch is ready the moment the device frees.
        self._device_lock = threading.RLock()
        self.consumer = worker_consumer(hostname)
        self.device_consumer = device_consumer(hostname, secrets.token_hex(4))
        self.member = worker_member(hostname, slots_of(settings))
        self._busy_since: float | None = None

    def model_busy_s(self) -> float:
        """How long the device has been held by the current batch; 0 when it is free."""
        since = self._busy_since
        return 0.0 if since is None else time.monotonic() - since

    def start(self) -> None:
        """Readies the process that runs batches (in prefork, each child): starts its
        heartbeat (a device consumer of its own marked alive, its status, its GPU claim),
        then loads every served model, raising ConfigError with one clear line on failure,
        and serves the streaming lane of each that can stream."""
        self.device_consumer = device_consumer(self.hostname, secrets.token_hex(4))
        threading.Thread(target=self._keep_alive, name="batchfleet-keep-alive", daemon=True).start()
        for name in self.model_names:
            model = self.model(name)
            stream = getattr(model, "stream", None)
            if callable(stream):
                lane = StreamLane(
                    self.settings, self.client, name, stream, self.device_consumer, model.version
                )
                lane.start()

    def _keep_alive(self) -> None:
        while True:
            self.beat()
            time.sleep(self.settings.worker.heartbeat_s)

    def beat(self) -> None:
        """Marks this process's device consumer alive, publishes its status (work done, its
        GPU's fresh reading) and checks its alerts; run every heartbeat. Redis being away
        only logs: the next beat tries again."""
        reading = self.gpu.read()
        status = {
            "at": f"{time.time():.3f}",
            "device": self.device,
            "models": ",".join(self.model_names),
            **(reading.fields() if reading is not None else {}),
            **self.work.fields(),
        }
        beat = NodeBeat(
            hostname=self.hostname,
            device_consumer=self.device_consumer,
            status=status,
            models=self.model_names,
            ttl_s=self.settings.worker.heartbeat_ttl_s,
            gpu_claim=self.gpu_claim,
            model_times=self.model_times.fields(),
        )
        try:
            depths, claim_held = node_heartbeat(self.client, self.keys, beat)
        except redis.RedisError as exc:
            log.warning("device heartbeat failed: %s", exc)
            return
        if not claim_held:
            log.critical(
                "another worker took this worker's GPU (its claim lapsed while Redis was "
                "away): exiting, for a supervisor to start it again on a free GPU"
            )
            os._exit(EXIT_GPU_LOST)
        self.alerts.check(time.time(), reading, depths, self.work.last_batch_at)

    def memory_low(self) -> bool:
        """Whether the pinned GPU's latest reading has less free memory than a batch needs
        to start (``worker.gpu_min_free_mb``); False without a reading."""
        reading = self.gpu.latest
        reserve = self.settings.worker.gpu_min_free_mb * 2**20
        return reading is not None and reading.memory_free_bytes < reserve

    def model(self, name: str) -> Model:
        with self._load_lock:
            if name not in self._models:
                started = time.monotonic()
                model = build_model(name, self.settings.policy(name), self.device)
                # Producers key the response cache by the version workers last loaded.
                self.client.set(self.keys.model_version(name), model.version)
                self._models[name] = model
                log.info(
                    "model %s loaded on %s in %.2fs", name, self.device, time.monotonic() - started
                )
            return self._models[name]

    def run_batch(
        self,
        model_name: str,
        batch_id: str,
        entries: Sequence[Sequence[str]],
        flush_reason: str | None = None,
        redelivered: bool = False,
    ) -> dict[str, Any]:
        """Runs one batch and writes one final answer per request; returns a summary.

        When the device frees, a batch below ``max_batch_size`` first tops itself up with
        requests that reached the stream since the batcher formed it (late binding). A batch
        of suspects (``isolated``) or one Celery delivers again (its worker may have died on
        one of its inputs) runs one request per model call instead.
        """
        state = FleetState(self.client, self.keys, model_name)
        try:
            state.batch_started(batch_id, self.member)
            ran = self._run_batch(model_name, batch_id, entries, flush_reason, redelivered)
        finally:
            # The slot comes back whatever happened; requests left unanswered by a failure
            # stay pending in the stream and are reclaimed after the lease.
            state.batch_done(batch_id, self.settings.batcher.reclaim_lease_s)
        return {"batch_id": batch_id, "size": len(entries), "ran": ran}

    def _run_batch(
        self,
        model_name: str,
        batch_id: str,
        entries: Sequence[Sequence[str]],
        flush_reason: str | None,
        redelivered: bool,
    ) -> int:
        policy = self.settings.policy(model_name)
        writer = ResultWriter(self.client, self.keys, model_name, policy.cache_ttl_s)
        stream = self.keys.requests(model_name)
        read = read_entries(
            [(entry_id, {STREAM_FIELD: raw}) for entry_id, raw in entries],
            model_name,
            policy.result_ttl_s,
        )
        finals = list(read.invalid)
        requests = read.requests
        entry_ids = [entry_id for entry_id, _ in entries]
        if redelivered:
            # The process this batch was delivered to died; what its device held counts an
            # attempt, as when a batcher reclaims it, and is given up at max_attempts. What a
            # live process's device holds is being run again there: it is left to that run.
            requests, running = self._count_attempts(writer, requests, policy.result_ttl_s, finals)
            entry_ids = [entry_id for entry_id in entry_ids if entry_id not in running]
        # Restart the lease (a running batch is never reclaimed while it can still finish)
        # and learn which requests a previous delivery already answered.
        done = writer.claim_and_check(
            self.consumer, entry_ids, [request.request_id for _, _, request in requests]
        )
        runnable = self._sort_out(requests, done, policy.result_ttl_s, finals)
        late: list[tuple[str, Request]] = []
        runs: list[ModelRun] = []
        if redelivered or flush_reason == "isolated":
            # Suspects and redelivered batches run one request per model call, so that an
            # input that kills the process is the only one on the device when it does. Each
            # answer is written before the device takes anything else (a finished suspect
            # still on the device when another batch kills the process would count a death);
            # between two of them the other slots' batches may take the device.
            for item in runnable:
                with self._device_lock:
                    single = self._run_on_device(model_name, stream, [item], 0, writer, finals)[1]
                    writer.finalize(
                        self._answers(
                            model_name,
                            batch_id,
                            single,
                            policy.result_ttl_s,
                            {item[0]: flush_reason},
                        )
                    )
                    self._observe(model_name, single)
        elif runnable or policy.tops_up:
            fill_to = self.batch_cap(model_name).current() if policy.tops_up else 0
            late, runs = self._run_on_device(model_name, stream, runnable, fill_to, writer, finals)
            runnable += late
        time.sleep(0)  # yield the GIL: the next batch's thread takes the device now
        reasons = {entry_id: flush_reason for entry_id, _ in runnable}
        reasons.update({entry_id: "late" for entry_id, _ in late})
        finals.extend(self._answers(model_name, batch_id, runs, policy.result_ttl_s, reasons))
        writer.finalize(finals)
        self._observe(model_name, runs)
        writer.drop(read.dropped)
        return len(runnable)

    def _observe(self, model_name: str, runs: Sequence[ModelRun]) -> None:
        """Tells the metrics of model calls whose answers are written."""
        for run in runs:
            requests = [request for _, request in run.items]
            self.metrics.observe_run(model_name, requests, run.model_s, run.finished_at)
            self.work.add(model_name, len(requests), run.model_s, run.finished_at)
            if run.error is None:
                self.model_times.add(model_name, len(requests), run.model_s)

    def _count_attempts(
        self,
        writer: ResultWriter,
        requests: Sequence[tuple[str, str, Request]],
        ttl_s: float,
        finals: list[Final],
    ) -> tuple[list[tuple[str, str, Request]], set[str]]:
        """The requests still to try, and the entries a live device is running now; those out
        of attempts go to ``finals`` as poison, and to the dead-letter stream."""
        attempts = writer.count_device_deaths(
            self.consumer, [entry_id for entry_id, _, _ in requests]
        )
        to_try, poison, running = [], [], set()
        for (entry_id, raw, request), tries in zip(requests, attempts, strict=True):
            if tries is None:
                running.add(entry_id)
            elif tries >= self.settings.batcher.max_attempts:
                finals.append(gave_up_final(request, entry_id, tries, ttl_s))
                poison.append((entry_id, raw, tries))
            else:
                to_try.append((entry_id, raw, request))
        writer.bury(poison)
        return to_try, running

    def _sort_out(
        self,
        requests: Sequence[tuple[str, str, Request]],
        done: Sequence[bool],
        ttl_s: float,
        finals: list[Final],
    ) -> list[tuple[str, Request]]:
        """The requests to run; those already answered or past their deadline go to ``finals``."""
        runnable = []
        now = time.time()
        for (entry_id, _, request), answered in zip(requests, done, strict=True):
            if answered:
                finals.append(Final(entry_id, _placeholder(request), request.digest, ttl_s))
            elif request.deadline_at <= now:
                finals.append(
                    error_final(
                        request,
                        entry_id,
                        "expired",
                        "deadline passed before the request ran",
                        ttl_s,
                    )
                )
            else:
                runnable.append((entry_id, request))
        return runnable

    def _run_on_device(
        self,
        model_name: str,
        stream: str,
        items: list[tuple[str, Request]],
        fill_to: int,
        writer: ResultWriter,
        finals: list[Final],
    ) -> tuple[list[tuple[str, Request]], list[ModelRun]]:
        """Takes the device, tops ``items`` up to ``fill_to`` with late joiners, and runs them;
        returns the late joiners and the model runs. The lock is held for the model only:
        answers are built after it frees."""
        predict = self._timed(self.model(model_name), self.batch_cap(model_name))
        confirm = _nothing
        try:
            with self._device_lock:
                arrived, confirm = self._claim_for_device(stream, items, fill_to)
                late = self._sort_late(arrived, model_name, writer, finals)
                batch = [*items, *late]
                return late, isolate_failures(predict, batch) if batch else []
        finally:
            confirm()

    def _claim_for_device(
        self, stream: str, items: Sequence[tuple[str, Request]], fill_to: int = 0
    ) -> tuple[list[StreamEntry], Callable[[], None]]:
        """Moves ``items`` to this worker's device consumer, restarting their lease, for the
        model call the caller makes next. A process that dies in that call is found holding
        exactly what was on its device: only those requests count an attempt when reclaimed.

        With ``fill_to`` it also takes requests no batcher has read yet, up to that batch
        size (late binding), in the same round trip, and returns them. With nothing to take,
        the claim is only sent, so the model starts at once; the returned ``confirm`` reads
        its reply, to be called once the device is released, whatever happened.
        """
        ids: list[Any] = [entry_id for entry_id, _ in items]
        room = fill_to - len(items)
        if room > 0:
            pipe = self.client.pipeline(transaction=False)
            if ids:
                pipe.xclaim(stream, CONSUMER_GROUP, self.device_consumer, 0, ids, justid=True)
            pipe.xreadgroup(CONSUMER_GROUP, self.device_consumer, {stream: ">"}, count=room)
            reply: Any = pipe.execute()[-1]
            return [entry for _, entries in reply or [] for entry in entries], _nothing
        if not ids:
            return [], _nothing
        pool = self.client.connection_pool
        connection = pool.get_connection()
        try:
            connection.send_command(  # type: ignore[no-untyped-call]
                "XCLAIM", stream, CONSUMER_GROUP, self.device_consumer, 0, *ids, "JUSTID"
            )
        except BaseException:
            pool.release(connection)
            raise

        def confirm() -> None:
            try:
                connection.read_response()
            finally:
                pool.release(connection)

        return [], confirm

    def _sort_late(
        self,
        entries: Sequence[StreamEntry],
        model_name: str,
        writer: ResultWriter,
        finals: list[Final],
    ) -> list[tuple[str, Request]]:
        """The late joiners to run; malformed or expired ones are answered in ``finals``."""
        if not entries:
            return []
        ttl_s = self.settings.policy(model_name).result_ttl_s
        read = read_entries(entries, model_name, ttl_s)
        finals.extend(read.invalid)
        writer.drop(read.dropped)
        return self._sort_out(read.requests, [False] * len(read.requests), ttl_s, finals)

    def _timed(self, model: Model, cap: BatchCap) -> Callable[[list[Any]], Sequence[Any]]:
        """``model.predict`` for one batch and its bisection, with the watchdog told how long
        each call has been running, and the model's batch cap told of successes and of the
        first out-of-memory error (the bisection's later ones are its own halves). A batch
        that would start with too little GPU memory free runs in halves; the shared cap is
        left alone (another process's memory, or a framework's cache, says nothing about
        what the model needs)."""
        lowered = checked = False

        def predict(inputs: list[Any]) -> Sequence[Any]:
            nonlocal lowered, checked
            if not checked:
                checked = True
                if len(inputs) > 1 and self.memory_low():
                    raise GpuMemoryLow(
                        f"under {self.settings.worker.gpu_min_free_mb} MiB of GPU memory free"
                    )
            self._busy_since = time.monotonic()
            try:
                outputs = model.predict(inputs)
            except Exception as exc:
                if not lowered and is_out_of_memory(exc):
                    lowered = True
                    cap.out_of_memory(len(inputs))
                raise
            finally:
                self._busy_since = None
            cap.succeeded(len(inputs))
            return outputs

        return predict

    def batch_cap(self, model_name: str) -> BatchCap:
        """The model's batch cap, as this process tracks it."""
        with self._load_lock:
            if model_name not in self._caps:
                policy = self.settings.policy(model_name)
                self._caps[model_name] = BatchCap(
                    self.client, self.keys, model_name, policy.max_batch_size
                )
            return self._caps[model_name]

    def _answers(
        self,
        model_name: str,
        batch_id: str,
        runs: list[ModelRun],
        ttl_s: float,
        reasons: dict[str, str | None],
    ) -> list[Final]:
        """One final answer per request of the model runs: its output, or an error for the
        inputs that failed alone (the model's ``ItemError`` code, else ``model_error``) and
        the outputs that cannot travel as JSON."""
        finals = []
        version = self.model(model_name).version
        for run in runs:
            for (entry_id, request), output in zip(run.items, run.outputs, strict=True):
                failure = _output_error(output, run.error)
                if failure is not None:
                    code, message = failure
                    log.warning(
                        "batch %s: request %s failed: %s", batch_id, request.request_id, message
                    )
                    finals.append(error_final(request, entry_id, code, message, ttl_s))
                    continue
                result = Result(
                    request_id=request.request_id,
                    model=model_name,
                    model_version=version,
                    output=output,
                    batch_id=batch_id,
                    batch_size=len(run.items),
                    flush_reason=reasons[entry_id],
                    model_s=run.model_s,
                    worker=self.hostname,
                    submitted_at=request.submitted_at,
                    finished_at=run.finished_at,
                )
                finals.append(Final(entry_id, result, request.digest, ttl_s))
        return finals


class WorkDone:
    """What a worker process has run since it started, in all and per model, for its status
    in Redis."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.batches = self.requests = 0
        self.busy_s = 0.0
        self.last_batch_at: float | None = None
        self._per_model: dict[str, list[int]] = {}

    def add(self, model: str, requests: int, model_s: float, finished_at: float) -> None:
        with self._lock:
            self.batches += 1
            self.requests += requests
            self.busy_s += model_s
            self.last_batch_at = finished_at
            counts = self._per_model.setdefault(model, [0, 0])
            counts[0] += 1
            counts[1] += requests

    def fields(self) -> dict[str, str]:
        """``batches``, ``requests``, ``busy_s``, ``last_batch_at``, and per model
        ``batches:{model}`` and ``requests:{model}``."""
        with self._lock:
            done = {
                "batches": str(self.batches),
                "requests": str(self.requests),
                "busy_s": f"{self.busy_s:.6f}",
            }
            for model, (batches, requests) in self._per_model.items():
                done[f"batches:{model}"] = str(batches)
                done[f"requests:{model}"] = str(requests)
            if self.last_batch_at is not None:
                done["last_batch_at"] = f"{self.last_batch_at:.3f}"
            return done


class GpuMemoryLow(Exception):
    """The GPU had too little memory free to start a batch: it runs in halves."""


@dataclass(frozen=True)
class ModelRun:
    """One ``predict`` call over ``items``: their outputs, or the error all of them share."""

    items: list[tuple[str, Request]]
    outputs: list[Any]
    error: str | None
    model_s: float
    finished_at: float


def isolate_failures(
    predict: Callable[[list[Any]], Sequence[Any]], items: list[tuple[str, Request]]
) -> list[ModelRun]:
    """Runs ``items`` through ``predict`` (the caller holds the device); a failing group is
    halved and retried until each failure is pinned on single inputs. A soft time limit is
    not retried: it fails the group."""
    started = time.monotonic()
    try:
        outputs = list(predict([request.input for _, request in items]))
        if len(outputs) != len(items):
            raise ValueError(f"model returned {len(outputs)} outputs for {len(items)} inputs")
    except Exception as exc:
        if len(items) == 1 or isinstance(exc, SoftTimeLimitExceeded):
            message = f"{type(exc).__name__}: {exc}"
            return [
                ModelRun(
                    items, [None] * len(items), message, time.monotonic() - started, time.time()
                )
            ]
        middle = len(items) // 2
        return isolate_failures(predict, items[:middle]) + isolate_failures(predict, items[middle:])
    return [ModelRun(items, outputs, None, time.monotonic() - started, time.time())]


def _output_error(output: Any, run_error: str | None) -> tuple[ErrorCode, str] | None:
    """Why ``output`` is no answer: its model call failed, the model returned an
    ``ItemError`` in its place, or it cannot travel as JSON; None when it is fine."""
    if run_error is not None:
        return "model_error", run_error
    if isinstance(output, ItemError):
        code = output.code if output.code in ("invalid_input", "model_error") else "model_error"
        return code, str(output.message)
    try:
        canonical_json(output)
    except InvalidInput as exc:
        return "model_error", f"output is not JSON: {exc}"
    return None


def _nothing() -> None:
    """A confirmation with nothing to confirm."""


def _placeholder(request: Request) -> Result:
    """Stands in for an answer already written; the finalize script keeps the first one."""
    return Result(request_id=request.request_id, model=request.model, finished_at=time.time())


def register_tasks(app: Celery, runtime: WorkerRuntime) -> None:
    """Registers the batch task on ``app``, bound to this process's runtime."""

    @app.task(  # type: ignore[untyped-decorator]
        name=RUN_BATCH_TASK, bind=True, acks_late=True, reject_on_worker_lost=True
    )
    def run_batch(
        task: Task,
        model: str,
        batch_id: str,
        entries: list[list[str]],
        flush_reason: str | None = None,
    ) -> dict[str, Any]:
        redelivered = bool((task.request.delivery_info or {}).get("redelivered"))
        return runtime.run_batch(model, batch_id, entries, flush_reason, redelivered)
