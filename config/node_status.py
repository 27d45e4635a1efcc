"""The node status hash (``Keys.node(hostname)``): what each worker process publishes every
heartbeat, and ``batchfleet top`` reads.

Every value is text. Counters run since the process started; ``top`` reads two statuses and
takes the difference over the change in ``at`` (the worker's own clock).

=========================  ==========================================================
field                      value
=========================  ==========================================================
``at``                     when the status was written, Unix seconds
``device``                 ``cpu``, ``cuda``…: where the models run
``models``                 the served models, comma-separated
``batches``                model calls so far
``requests``               requests those calls ran
``busy_s``                 seconds the device spent in model calls
``last_batch_at``          when the last call finished (absent before the first)
``batches:{model}``        model calls of one model
``requests:{model}``       requests of one model
``gpu_{figure}``           the GPU's latest NVML reading (``GPU_FIELDS``), when pinned
=========================  ==========================================================
"""

from __future__ import annotations

from collections.abc import Mapping

AT = "at"
DEVICE = "device"
MODELS = "models"
BATCHES = "batches"
REQUESTS = "requests"
BUSY_S = "busy_s"
LAST_BATCH_AT = "last_batch_at"

GPU_PREFIX = "gpu_"
GPU_NAME = "gpu_name"
GPU_UTILISATION = "gpu_utilisation"
GPU_MEMORY_USED_BYTES = "gpu_memory_used_bytes"
GPU_MEMORY_TOTAL_BYTES = "gpu_memory_total_bytes"
GPU_UUID = "gpu_uuid"
GPU_FIELDS = (
    "gpu_index",
    GPU_NAME,
    GPU_UTILISATION,
    GPU_MEMORY_USED_BYTES,
    GPU_MEMORY_TOTAL_BYTES,
    "gpu_temperature_c",
    "gpu_power_w",
    GPU_UUID,
)


def batches_of(model: str) -> str:
    """The field counting ``model``'s calls."""
    return f"{BATCHES}:{model}"


def requests_of(model: str) -> str:
    """The field counting the requests of ``model``'s calls."""
    return f"{REQUESTS}:{model}"


def device_of(hostname: str, status: Mapping[str, str]) -> str:
    """The device a worker process's status says it runs on: its GPU's UUID where it reads
    one (processes sharing a GPU, ``worker.processes_per_gpu``, share it), else the process."""
    return status.get(GPU_UUID, hostname)
