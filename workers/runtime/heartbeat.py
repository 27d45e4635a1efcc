"""A worker process's one heartbeat thread, every ``worker.heartbeat_s``.

What it beats depends on what the process does:
- **where batches run** (the worker, or each prefork child): marks the process's device
  consumer alive, publishes its node status (work done, its GPU's fresh reading), renews its
  GPU claim and checks its alerts;
- **where Celery takes tasks** (the worker, or the prefork parent), from ``join`` (Celery is
  ready) until ``leave`` (shutdown starts): tells batchers the worker is alive, and its slots.

It is also the watchdog of the threads and solo pools, where Celery enforces no time limit: a
model call past ``time_limit_s`` ends the process, as a hard limit does in prefork, so that
its requests are reclaimed and a supervisor starts a fresh worker. Redis being away only
logs: the next beat tries again.

From ``leave`` on, a timer bounds the shutdown: a worker that has not exited
``shutdown_grace_s`` after it was told to stop (its running batch done, or its Redis and
broker unreachable, every call waiting out its socket timeout) exits at once; what it held is
delivered again or reclaimed, as after a crash.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from typing import TYPE_CHECKING

import redis

from config import node_status
from workers.protocol.capacity import FleetState, NodeBeat, node_heartbeat

if TYPE_CHECKING:
    from config.settings import Settings
    from workers.runtime.runtime import WorkerRuntime

log = logging.getLogger(__name__)

EXIT_STUCK = 70
EXIT_GPU_LOST = 71
EXIT_SHUTDOWN_STUCK = 72
WATCH_INTERVAL_S = 0.5


class Heartbeat:
    """The heartbeat and watchdog of one worker process (``runs_batches``: where batches run)."""

    def __init__(self, runtime: WorkerRuntime, runs_batches: bool = True) -> None:
        self._runtime = runtime
        self._runs_batches = runs_batches
        self._states = [
            FleetState(runtime.client, runtime.keys, model) for model in runtime.model_names
        ]
        self._joined = threading.Event()
        self._leaving = threading.Event()
        self._warned_soft = False

    def start(self) -> None:
        """Beats now, then every ``heartbeat_s`` from a daemon thread."""
        threading.Thread(target=self._run, name="batchfleet-heartbeat", daemon=True).start()

    def join(self) -> None:
        """Starts telling batchers this worker takes batches (Celery is ready)."""
        self._joined.set()

    def leave(self) -> None:
        """Stops telling batchers this worker takes batches, and says so at once; the rest
        beats on (batches still running keep their device alive, and the watchdog keeps a hung
        model call from blocking a graceful shutdown forever)."""
        self._leaving.set()
        deadline = threading.Timer(shutdown_grace_s(self._runtime.settings), self._give_up)
        deadline.daemon = True
        deadline.start()
        for state in self._states:
            try:
                state.leave(self._runtime.member)
            except Exception as exc:
                log.warning("could not deregister worker: %s", exc)

    def _give_up(self) -> None:
        log.critical(
            "still shutting down %.0fs after being told to stop (Redis or the broker "
            "unreachable?): exiting; what this worker held is delivered again or reclaimed",
            shutdown_grace_s(self._runtime.settings),
        )
        os._exit(EXIT_SHUTDOWN_STUCK)

    def beat(self) -> None:
        """One heartbeat: the device and status where batches run, the membership once joined."""
        if self._runs_batches:
            self._beat_node()
        if self._joined.is_set() and not self._leaving.is_set():
            beaten = 0
            for state in self._states:
                try:
                    state.heartbeat(
                        self._runtime.member, self._runtime.settings.worker.heartbeat_ttl_s
                    )
                    beaten += 1
                except Exception as exc:
                    log.warning("heartbeat failed: %s", exc)
            if beaten == len(self._states):
                self._runtime.health.reached()  # joined, and every batcher can see it

    def _run(self) -> None:
        interval_s = self._runtime.settings.worker.heartbeat_s
        next_beat = time.monotonic()
        while True:
            self._runtime.health.turned()
            self._watch_model_time()
            if time.monotonic() >= next_beat:
                self.beat()
                next_beat = time.monotonic() + interval_s
            time.sleep(min(interval_s, WATCH_INTERVAL_S))

    def _beat_node(self) -> None:
        runtime = self._runtime
        reading = runtime.gpu.read()
        status = {
            node_status.AT: f"{time.time():.3f}",
            node_status.DEVICE: runtime.device_name,
            node_status.MODELS: ",".join(runtime.model_names),
            **(reading.fields() if reading is not None else {}),
            **runtime.work.fields(),
        }
        beat = NodeBeat(
            hostname=runtime.hostname,
            device_consumer=runtime.device.consumer,
            status=status,
            models=runtime.model_names,
            ttl_s=runtime.settings.worker.heartbeat_ttl_s,
            gpu_claim=runtime.gpu_claim,
            model_times=runtime.model_times.fields(),
        )
        try:
            depths, claim_held = node_heartbeat(runtime.client, runtime.keys, beat)
        except redis.RedisError as exc:
            log.warning("device heartbeat failed: %s", exc)
            return
        if not claim_held:
            log.critical(
                "another worker took this worker's GPU (its claim lapsed while Redis was "
                "away): exiting, for a supervisor to start it again on a free GPU"
            )
            os._exit(EXIT_GPU_LOST)
        runtime.alerts.check(time.time(), reading, depths, runtime.work.last_batch_at)

    def _watch_model_time(self) -> None:
        limits = self._runtime.settings.worker
        if limits.pool == "prefork":
            return
        busy_s = self._runtime.device.busy_s()
        if busy_s < limits.soft_time_limit_s:
            self._warned_soft = False
            return
        if busy_s < limits.time_limit_s:
            if not self._warned_soft:
                log.warning(
                    "a batch has been in the model for %.1fs (soft limit %.1fs)",
                    busy_s,
                    limits.soft_time_limit_s,
                )
                self._warned_soft = True
            return
        log.critical(
            "a batch has been in the model for %.1fs, past the hard limit of %.1fs: "
            "exiting so that its requests are reclaimed and the worker replaced",
            busy_s,
            limits.time_limit_s,
        )
        for state in self._states:
            with contextlib.suppress(Exception):
                state.leave(self._runtime.member)
        os._exit(EXIT_STUCK)


def shutdown_grace_s(settings: Settings) -> float:
    """How long a worker may take to stop once told to: its running batch's hard time limit,
    and two socket timeouts to write its answers and hand back its task."""
    return settings.worker.time_limit_s + 2 * settings.redis_socket_timeout_s
