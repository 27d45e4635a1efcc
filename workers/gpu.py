"""GPU discovery, utilisation sampling (NVML), and pinning a process to one GPU before any CUDA
library loads."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence

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


def pin_to_gpu(index: int) -> str:
    """Makes GPU ``index`` the only one this process sees; returns the torch-style device.

    Must run before any CUDA library is imported: CUDA reads ``CUDA_VISIBLE_DEVICES`` once.
    """
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
