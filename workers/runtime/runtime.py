"""What one worker process holds, and how it runs a batch: its models (loaded once), its
device, its Redis client, its name."""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis

from config.batch_task import BatchTask
from config.connection import connect
from config.keys import Keys, device_consumer, worker_consumer
from config.replica_wait import ReplicaWait
from config.settings import Settings
from workers.models.base import Model, postprocess_of
from workers.models.registry import build_model
from workers.protocol.batch_cap import BatchCap
from workers.protocol.capacity import FleetState, GpuClaim, worker_member
from workers.protocol.health import Health
from workers.protocol.model_times import MeasuredModelTimes
from workers.protocol.results import ResultWriter
from workers.runtime.alerts import WorkerAlerts
from workers.runtime.answers import answers_of
from workers.runtime.batch_run import BatchRun
from workers.runtime.device import (
    ClaimAhead,
    Device,
    ModelRun,
    Runnable,
    isolate_failures,
    postprocessed,
    reads_late_joiners,
)
from workers.runtime.gpu import GpuTelemetry
from workers.runtime.heartbeat import Heartbeat
from workers.runtime.metrics import WorkerMetrics
from workers.runtime.stream_lane import StreamLane
from workers.runtime.work_done import WorkDone

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelRecords:
    """What a worker process writes to Redis for one served model: its answers, its batches'
    slots and its batch cap."""

    writer: ResultWriter
    state: FleetState
    cap: BatchCap


class WorkerRuntime:
    """One worker process: its models, its device, its Redis client, its name."""

    def __init__(
        self,
        settings: Settings,
        hostname: str,
        device_name: str,
        models: Sequence[str],
        client: redis.Redis | None = None,
        gpu: int | None = None,
        gpu_claim: GpuClaim | None = None,
    ) -> None:
        self.settings = settings
        self.hostname = hostname
        self.device_name = device_name
        self.model_names = list(models)
        self.gpu = GpuTelemetry(gpu)
        self.gpu_claim = gpu_claim
        self.metrics = WorkerMetrics(self.gpu, hostname, models)
        self.work = WorkDone()
        # The heartbeat's loop: live while it turns, ready while it keeps the worker joined.
        self.health = Health()
        self.model_times = MeasuredModelTimes()
        self.alerts = WorkerAlerts(settings.alerts, hostname, started_at=time.time())
        self.keys = Keys(settings.key_prefix)
        self.client = client or connect(settings)
        self._replica_wait = ReplicaWait.of(settings)
        self.consumer = worker_consumer(hostname)
        self.member = worker_member(hostname, settings.worker.slots)
        self.device = Device(
            settings, self.client, self.gpu, self._new_device_consumer(), self.model_times
        )
        self._models: dict[str, Model] = {}
        self._records: dict[str, ModelRecords] = {}
        self._load_lock = threading.Lock()

    def _new_device_consumer(self) -> str:
        return device_consumer(self.hostname, secrets.token_hex(4))

    def start(self) -> Heartbeat:
        """Readies the process that runs batches (in prefork, each child): a device consumer
        of its own, its heartbeat (started, returned), then every served model loaded
        (ConfigError with one clear line on failure) and the streaming lane of each that can
        stream."""
        self.device.consumer = self._new_device_consumer()
        heartbeat = Heartbeat(self)
        heartbeat.start()
        for name in self.model_names:
            model = self.model(name)
            stream = getattr(model, "stream", None)
            if callable(stream):
                lane = StreamLane(
                    self.settings, self.client, name, stream, self.device.consumer, model.version
                )
                lane.start()
        return heartbeat

    def model(self, name: str) -> Model:
        """The model ``name``, loaded on this process's device the first time it is asked for."""
        with self._load_lock:
            if name not in self._models:
                started = time.monotonic()
                model = build_model(name, self.settings.policy(name), self.device_name)
                # Producers key the response cache by the version workers last loaded.
                self.client.set(self.keys.model_version(name), model.version)
                self._models[name] = model
                log.info(
                    "model %s loaded on %s in %.2fs",
                    name,
                    self.device_name,
                    time.monotonic() - started,
                )
            return self._models[name]

    def records(self, model_name: str) -> ModelRecords:
        """What this process writes for the model, built the first time it is asked for (its
        scripts registered once, not per batch)."""
        with self._load_lock:
            if model_name not in self._records:
                policy = self.settings.policy(model_name)
                self._records[model_name] = ModelRecords(
                    writer=ResultWriter(
                        self.client,
                        self.keys,
                        model_name,
                        policy.cache_ttl_s,
                        self._replica_wait,
                    ),
                    state=FleetState(self.client, self.keys, model_name),
                    cap=BatchCap(self.client, self.keys, model_name, policy.max_batch_size),
                )
            return self._records[model_name]

    def batch_cap(self, model_name: str) -> BatchCap:
        """The model's batch cap, as this process tracks it."""
        return self.records(model_name).cap

    def run_batch(self, task: BatchTask, redelivered: bool = False) -> dict[str, Any]:
        """Runs one batch and writes one final answer per request; returns a summary.

        When the device frees, a batch below ``max_batch_size`` first tops itself up with
        requests that reached the stream since the batcher formed it (late binding). A batch
        of suspects (``isolated``) or one Celery delivers again (its worker may have died on
        one of its inputs) runs one request per model call instead.
        """
        policy = self.settings.policy(task.model)
        records = self.records(task.model)
        batch = BatchRun(
            task.model,
            task.batch_id,
            task.flush_reason,
            writer=records.writer,
            state=records.state,
            ttl_s=policy.result_ttl_s,
            lease_s=self.settings.batcher.reclaim_lease_s,
        )
        try:
            ran = self._run_batch(batch, task.entries, redelivered, policy.tops_up)
        finally:
            try:
                batch.free_slot()
            finally:
                batch.slot_freed()
        return {"batch_id": task.batch_id, "size": len(task.entries), "ran": ran}

    def _run_batch(
        self, batch: BatchRun, entries: Sequence[Sequence[str]], redelivered: bool, tops_up: bool
    ) -> int:
        attempts = None
        if redelivered:
            # The process this batch was delivered to died; what its device held counts an
            # attempt, as when a batcher reclaims it, and is given up at max_attempts. What a
            # live process's device holds is being run again there: it is left to that run.
            attempts = batch.count_attempts(self.consumer, [entry_id for entry_id, _ in entries])
            entries = [entry for entry in entries if attempts[entry[0]] is not None]
        decoded = batch.start(self.consumer, self.member, entries)
        if attempts is not None:
            decoded = batch.give_up_poison(decoded, attempts, self.settings.batcher.max_attempts)
        runnable = batch.sort_out(decoded)
        model = self.model(batch.model)
        runs: list[ModelRun] = []
        if redelivered or batch.flush_reason == "isolated":
            # Suspects and redelivered batches run one request per model call, so that an
            # input that kills the process is the only one on the device when it does. Each
            # answer is written before the device takes anything else (a finished suspect
            # still on the device when another batch kills the process would count a death);
            # between two of them the other slots' batches may take the device.
            for one in runnable:
                with self.device.held():
                    single = self._run_on_device(batch, [one], 0)
                    batch.writer.finalize(answers_of(batch, single, model.version, self.hostname))
                    self._observe(batch.model, single)
        elif runnable or tops_up:
            fill_to = self.batch_cap(batch.model).current() if tops_up else 0
            runs = self._run_on_device(batch, runnable, fill_to, free_slot=True)
        batch.finish(answers_of(batch, runs, model.version, self.hostname))
        self._observe(batch.model, runs)
        return len(runnable) + len(batch.late)

    def _run_on_device(
        self, batch: BatchRun, runnable: list[Runnable], fill_to: int, free_slot: bool = False
    ) -> list[ModelRun]:
        """Takes the device, tops ``runnable`` up to ``fill_to`` with late joiners (read
        ahead while the device is busy, the claim readied with them: see ``Device.held``),
        and runs them; with ``free_slot``, gives the batch's slot back before the device frees
        (to a batch waiting for it: ``BatchRun.free_slot``). The lock is held for the model
        only: a model's ``postprocess`` runs once it frees (``postprocessed``), and the caller
        builds the answers after."""
        stream = self.keys.stream(batch.model)
        model = self.model(batch.model)
        predict = self.device.timed(batch.model, model, self.batch_cap(batch.model))
        postprocesses = postprocess_of(model) is not None
        reads = reads_late_joiners(runnable, fill_to)
        room = fill_to - len(runnable)
        ahead = ClaimAhead(
            (lambda: batch.sort_late(self.device.read_late_joiners(stream, self.consumer, room)))
            if reads
            else None,
            lambda late: self.device.ready_claim(stream, [*runnable, *late]),
        )
        confirm = None
        try:
            with self.device.held(reads, ahead):
                ready = [*runnable, *ahead.runnables]
                arrived, confirm = self.device.claim(
                    stream, ready, 0 if ahead.fresh() else fill_to, ahead.claim
                )
                on_device = [*ready, *batch.sort_late(arrived)]
                runs = isolate_failures(predict, on_device, postprocesses) if on_device else []
                if free_slot:
                    batch.free_slot(self.device)
        finally:
            ahead.give_back()
            if confirm is not None:
                confirm()
        return postprocessed(model, runs)

    def _observe(self, model_name: str, runs: Sequence[ModelRun]) -> None:
        """Tells the metrics of model calls whose answers are written."""
        for run in runs:
            requests = [request for _, request in run.runnables]
            self.metrics.observe_run(model_name, requests, run.model_s, run.finished_at)
            self.work.add(model_name, len(requests), run.model_s, run.finished_at)
            if run.error is None:
                self.model_times.add(model_name, len(requests), run.model_s)
