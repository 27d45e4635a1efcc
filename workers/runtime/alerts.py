"""A worker's own alerts: the conditions ``config/prometheus/alerts.yml`` encodes, logged as
warnings by the worker that sees them, so that a fleet without Prometheus still says so.

Each condition must hold for ``alerts.for_s`` before it is logged, once; it is logged again only
after it has cleared. A stuck worker is one that finished no batch for ``alerts.stuck_s`` while
its queue had work.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from config.settings import AlertSettings
from workers.runtime.gpu import GpuReading

log = logging.getLogger(__name__)


@dataclass
class _Condition:
    since: float | None = None
    warned: bool = False


@dataclass
class WorkerAlerts:
    """Checks one worker's conditions every heartbeat; ``check`` returns what it warned."""

    settings: AlertSettings
    worker: str
    started_at: float
    _conditions: dict[str, _Condition] = field(default_factory=dict)

    def check(
        self,
        now: float,
        reading: GpuReading | None,
        depths: Mapping[str, int],
        last_batch_at: float | None,
    ) -> list[str]:
        limits = self.settings
        waiting = {model: depth for model, depth in depths.items() if depth > 0}
        utilisation = reading.utilisation if reading is not None else None
        temperature = reading.temperature_c if reading is not None else None
        idle_s = now - (last_batch_at if last_batch_at is not None else self.started_at)
        found: dict[str, str | None] = {
            "gpu_underused": f"GPU utilisation {utilisation:.0%} (under "
            f"{limits.low_utilisation:.0%}) while requests wait: {waiting}"
            if waiting and utilisation is not None and utilisation < limits.low_utilisation
            else None,
            "gpu_hot": f"GPU at {temperature:g} °C, over {limits.temperature_c:g} °C"
            if temperature is not None and temperature > limits.temperature_c
            else None,
            "queue_deep": f"queue depth over {limits.queue_depth}: {waiting}"
            if any(depth > limits.queue_depth for depth in depths.values())
            else None,
            "stuck": f"no batch finished for {idle_s:.0f}s while requests wait: {waiting}"
            if waiting and idle_s > limits.stuck_s
            else None,
        }
        warned = []
        for name, message in found.items():
            condition = self._conditions.setdefault(name, _Condition())
            if message is None:
                condition.since, condition.warned = None, False
                continue
            condition.since = now if condition.since is None else condition.since
            held_for_s = 0.0 if name == "stuck" else limits.for_s
            if not condition.warned and now - condition.since >= held_for_s:
                condition.warned = True
                log.warning("worker %s: %s", self.worker, message)
                warned.append(name)
        return warned
