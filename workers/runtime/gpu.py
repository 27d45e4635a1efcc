"""GPU discovery, telemetry and utilisation sampling (NVML), and pinning a process to one GPU
before any CUDA library loads."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from config import node_status

log = logging.getLogger(__name__)


def gpu_count() -> int:
    """How many GPUs NVML reports; 0 when there is no NVIDIA driver or GPU."""
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        log.info("no GPU: NVML unavailable (%s)", exc)
        return 0
    try:
        return int(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()


def gpu_uuids() -> list[str]:
    """The UUIDs of the GPUs NVML reports, by index; none without an NVIDIA driver or GPU."""
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        log.info("no GPU: NVML unavailable (%s)", exc)
        return []
    try:
        return [
            _text(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(index)))
            for index in range(pynvml.nvmlDeviceGetCount())
        ]
    finally:
        pynvml.nvmlShutdown()


def pin_to_gpu(index: int) -> str:
    """Makes GPU ``index`` the only one this process sees; returns the torch-style device.

    Must run before any CUDA library is imported: CUDA reads ``CUDA_VISIBLE_DEVICES`` once.
    """
    # CUDA numbers GPUs fastest first unless told otherwise; NVML numbers them by PCI bus.
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    os.environ["CUDA_VISIBLE_DEVICES"] = str(index)
    return "cuda"


def hide_gpus() -> str:
    """Runs this process on the CPU; returns the device name."""
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    return "cpu"


class GpuSampler:
    """Samples NVML's utilisation of some GPUs in a thread while a load runs.

    ``utilisation()`` is the mean of the samples over every GPU (0..1), None when NVML has no
    such GPU or no sample was taken.
    """

    def __init__(self, indices: Sequence[int], interval_s: float = 0.1) -> None:
        self.indices = list(indices)
        self.interval_s = interval_s
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpu-sampler", daemon=True)

    def _run(self) -> None:
        import pynvml

        if not self.indices:
            return
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            log.warning("no GPU utilisation: NVML unavailable (%s)", exc)
            return
        try:
            handles = [pynvml.nvmlDeviceGetHandleByIndex(index) for index in self.indices]
            while not self._stop.wait(self.interval_s):
                rates = [pynvml.nvmlDeviceGetUtilizationRates(handle) for handle in handles]
                self.samples.append(sum(rate.gpu for rate in rates) / (100 * len(rates)))
        except pynvml.NVMLError as exc:
            log.warning("GPU utilisation sampling stopped: %s", exc)
        finally:
            pynvml.nvmlShutdown()

    def __enter__(self) -> GpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def utilisation(self) -> float | None:
        return sum(self.samples) / len(self.samples) if self.samples else None


T = TypeVar("T")


@dataclass(frozen=True)
class GpuReading:
    """One NVML reading of a GPU; a field the GPU does not report is None."""

    index: int
    name: str
    utilisation: float | None  # 0..1, over NVML's last sample period
    memory_used_bytes: int
    memory_total_bytes: int
    temperature_c: float | None
    power_w: float | None
    uuid: str | None = None  # tells apart the processes sharing one GPU from GPUs of their own

    @property
    def memory_free_bytes(self) -> int:
        return self.memory_total_bytes - self.memory_used_bytes

    def fields(self) -> dict[str, str]:
        """The reading as a flat string map (a Redis hash), each name prefixed ``gpu_``;
        absent figures are left out."""
        return {
            f"{node_status.GPU_PREFIX}{key}": str(value)
            for key, value in asdict(self).items()
            if value is not None
        }


class GpuTelemetry:
    """Reads one pinned GPU through NVML and keeps the latest reading.

    Without a GPU (``index`` None) or without NVML, it says so once in the log and reads
    nothing; no call raises.
    """

    def __init__(self, index: int | None) -> None:
        self.index = index
        self.latest: GpuReading | None = None
        self._handle: Any = None
        self._absent = False

    def read(self) -> GpuReading | None:
        """A fresh reading (kept as ``latest``), None without a GPU or NVML."""
        handle = self._open()
        if handle is None or self.index is None:
            return None
        import pynvml

        try:
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            reading = GpuReading(
                index=self.index,
                name=_text(pynvml.nvmlDeviceGetName(handle)),
                utilisation=_optional(
                    lambda: pynvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100
                ),
                memory_used_bytes=int(memory.used),
                memory_total_bytes=int(memory.total),
                temperature_c=_optional(
                    lambda: float(
                        pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)
                    )
                ),
                power_w=_optional(lambda: pynvml.nvmlDeviceGetPowerUsage(handle) / 1000),
                uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
            )
        except pynvml.NVMLError as exc:
            log.warning("GPU %s: NVML reading failed: %s", self.index, exc)
            return None
        self.latest = reading
        return reading

    def _open(self) -> Any:
        if self._handle is not None or self._absent:
            return self._handle
        if self.index is None:
            self._absent = True
            log.info("no GPU pinned: no GPU telemetry")
            return None
        import pynvml

        try:
            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
        except pynvml.NVMLError as exc:
            self._absent = True
            log.warning("GPU %s: NVML unavailable (%s): no GPU telemetry", self.index, exc)
        return self._handle


def _optional(read: Callable[[], T]) -> T | None:
    """A figure some GPUs do not report (power on some boards, say): None when NVML says so."""
    import pynvml

    try:
        return read()
    except pynvml.NVMLError:
        return None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
