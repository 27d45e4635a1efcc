"""GPU discovery (NVML) and pinning a process to one GPU before any CUDA library loads."""

from __future__ import annotations

import logging
import os

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
