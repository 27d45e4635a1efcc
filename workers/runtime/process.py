"""Starts GPU-pinned Celery workers: one process per GPU (``worker.processes_per_gpu`` of
them), the model loaded once in each."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from types import FrameType
from typing import Literal

from celery.signals import worker_process_init, worker_ready, worker_shutting_down

from config.connection import connect
from config.errors import ConfigError
from config.garbage_collection import settle_garbage_collection
from config.keys import Keys
from config.settings import Settings
from workers.protocol.capacity import claim_gpu
from workers.protocol.celery_app import make_celery_app
from workers.protocol.metrics_endpoint import serve_metrics
from workers.runtime.cpu_core import pin_to_core
from workers.runtime.gpu import gpu_count, gpu_uuids, hide_gpus, pin_to_gpu
from workers.runtime.heartbeat import Heartbeat
from workers.runtime.runtime import WorkerRuntime
from workers.runtime.tasks import register_tasks
from workers.runtime.timer_slack import tighten_timer_slack

log = logging.getLogger(__name__)


def worker_hostname(gpu: int | None, share: int | None = None) -> str:
    """The Celery node name: the GPU id and the host, e.g. ``gpu0@node7``, with the process's
    place on its GPU where several share it (``gpu0-1@node7``)."""
    host = socket.gethostname()
    if gpu is None:
        return f"cpu-{os.getpid()}@{host}"
    return f"gpu{gpu}@{host}" if share is None else f"gpu{gpu}-{share}@{host}"


GIL_SWITCH_INTERVAL_S = 0.0005
PER_TASK_LOGGERS = ("celery.worker.strategy", "celery.app.trace")


def require_gpu(index: int) -> None:
    """Refuses a GPU this machine does not have, instead of running on the CPU as if pinned.

    Raises:
        ConfigError: naming how many GPUs NVML finds.
    """
    found = gpu_count()
    if not 0 <= index < found:
        where = (
            "NVML finds no GPU on this machine (no NVIDIA driver or GPU): use --cpu"
            if found == 0
            else f"this machine has {found} GPU(s), numbered 0 to {found - 1}"
        )
        raise ConfigError(f"--gpu {index}: {where}")


def run_worker(
    settings: Settings,
    models: Sequence[str],
    gpu: int | Literal["auto"] | None,
    name: str | None = None,
    metrics_port: int | None = None,
    core: int | None = None,
) -> int:
    """Runs one Celery worker process serving ``models`` (and its metrics on
    ``metrics_port``) on GPU ``gpu``, on the first GPU no live worker claimed (``auto``), or
    on the CPU (None), pinned to CPU ``core`` where given (``pin_to_core``); returns its exit
    code.

    Raises:
        ConfigError: a GPU or core this machine does not have; a core with the prefork pool,
            whose children would all share it.
    """
    if core is not None:
        if settings.worker.pool == "prefork":
            raise ConfigError("--core pins one process: the prefork pool runs batches in several")
        pin_to_core(core)
    claim = share = None
    if gpu == "auto":
        uuids = gpu_uuids()
        owner = f"{name or socket.gethostname()}:{os.getpid()}"
        per_gpu = settings.worker.processes_per_gpu
        claimed = claim_gpu(
            connect(settings),
            Keys(settings.key_prefix),
            uuids,
            owner,
            settings.worker.heartbeat_ttl_s,
            per_gpu,
        )
        gpu, claim = claimed.index, claimed.claim
        share = claimed.share if per_gpu > 1 else None
        log.info("--gpu auto: claimed GPU %d (%s), place %d", gpu, uuids[gpu], claimed.share)
    if gpu is not None:
        require_gpu(gpu)
    device = pin_to_gpu(gpu) if gpu is not None else hide_gpus()
    # The next batch's thread must take the device the moment it frees, not when the
    # finishing thread's 5 ms GIL slice ends.
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    # Before any thread starts: each takes it from this one.
    tighten_timer_slack()
    hostname = name or worker_hostname(gpu, share)
    if gpu is None:
        log.info("worker %s runs on the CPU (no GPU assigned)", hostname)
    runtime = WorkerRuntime(settings, hostname, device, models, gpu=gpu, gpu_claim=claim)
    pool = settings.worker.pool
    if metrics_port is not None:
        if pool == "prefork":
            log.warning("metrics: batches run in prefork children, whose figures are not served")
        serve_metrics(
            runtime.metrics.registry, metrics_port, settings.metrics_host, [runtime.health]
        )
    if pool == "prefork":
        # Batches run in the children, each with a heartbeat of its own; the parent, where
        # Celery takes tasks, beats only the membership.
        # Its thread starts once the children are forked, never before a fork.
        worker_process_init.connect(lambda **_: _start_child(runtime), weak=False)
        heartbeat = Heartbeat(runtime, runs_batches=False)
        worker_ready.connect(lambda **_: heartbeat.start(), weak=False)
    else:
        heartbeat = runtime.start()
    app = make_celery_app(settings)
    register_tasks(app, runtime)
    worker_ready.connect(lambda **_: heartbeat.join(), weak=False)
    worker_shutting_down.connect(lambda **_: heartbeat.leave(), weak=False)
    # Celery logs two lines per task at INFO (received, succeeded): hundreds a second with
    # a fast model, and about 5% of a worker's CPU. Batches show in Flower and the metrics;
    # a task that fails is still logged, at ERROR.
    for per_task in PER_TASK_LOGGERS:
        logging.getLogger(per_task).setLevel(logging.WARNING)
    worker = app.Worker(
        hostname=hostname,
        pool=pool,
        concurrency=settings.worker.celery_concurrency,
        queues=[runtime.keys.celery_queue(model) for model in models],
        loglevel="INFO",
        task_events=True,
        without_gossip=True,
        without_mingle=True,
    )
    settle_garbage_collection()  # the models are loaded (with the threads pool), Celery built
    worker.start()
    return int(worker.exitcode or 0)


def _start_child(runtime: WorkerRuntime) -> None:
    """Readies a prefork child to run batches: its runtime started (its models loaded), then
    its garbage collector settled."""
    runtime.start()
    settle_garbage_collection()


def pinned_worker_commands(
    models: Sequence[str], gpus: int, per_gpu: int, metrics_port: int | None
) -> list[list[str]]:
    """The command of each pinned worker process, ``per_gpu`` on each of ``gpus`` GPUs. Where
    several share a GPU they are named by their place on it (``gpu0-1@host``); the one in place
    S of GPU N serves its metrics on ``metrics_port + N * per_gpu + S``."""
    base = [sys.executable, "-m", "workers.cli", "worker"]
    for model in models:
        base += ["--model", model]
    commands = []
    for gpu in range(gpus):
        for share in range(per_gpu):
            command = [*base, "--gpu", str(gpu)]
            if per_gpu > 1:
                command += ["--name", worker_hostname(gpu, share)]
            if metrics_port is not None:
                command += ["--metrics-port", str(metrics_port + gpu * per_gpu + share)]
            commands.append(command)
    return commands


def run_worker_per_gpu(
    settings: Settings, models: Sequence[str], metrics_port: int | None = None
) -> int:
    """Starts ``worker.processes_per_gpu`` pinned worker processes on each GPU NVML reports
    (one CPU worker if none), as ``pinned_worker_commands`` says."""
    count = gpu_count()
    per_gpu = settings.worker.processes_per_gpu
    if count == 0:
        log.info("no GPU found: starting one CPU worker")
        return run_worker(settings, models, gpu=None, metrics_port=metrics_port)
    if count * per_gpu == 1:
        return run_worker(settings, models, gpu=0, metrics_port=metrics_port)
    commands = pinned_worker_commands(models, count, per_gpu, metrics_port)
    children = [subprocess.Popen(command) for command in commands]
    log.info("started %d workers, %d per GPU", len(children), per_gpu)

    def forward(signum: int, _frame: FrameType | None) -> None:
        for child in children:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    return max(child.wait() for child in children)
