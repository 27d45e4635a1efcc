"""NVML utilisation sampling for the benchmarks, against a stand-in NVML module."""

from __future__ import annotations

import sys
import threading
import types
from collections.abc import Iterator

import pytest

from workers.gpu import GpuSampler


class FakeNvml(types.ModuleType):
    """Two GPUs busy 40% and 80%; counts its samples so a test can wait for some."""

    class NVMLError(Exception):
        pass

    def __init__(self) -> None:
        super().__init__("pynvml")
        self.sampled = threading.Semaphore(0)
        self.shut_down = False

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        self.shut_down = True

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> types.SimpleNamespace:
        self.sampled.release()
        return types.SimpleNamespace(gpu=40 if handle == 0 else 80, memory=0)


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeNvml]:
    fake = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    yield fake


def test_the_sampler_averages_utilisation_over_its_gpus(nvml: FakeNvml) -> None:
    """Samples taken while a load runs average the sampled GPUs' utilisation, as a fraction."""
    with GpuSampler([0, 1], interval_s=0.001) as sampler:
        for _ in range(6):
            assert nvml.sampled.acquire(timeout=5)
    assert sampler.utilisation() == pytest.approx(0.6)
    assert nvml.shut_down


def test_no_gpus_means_no_utilisation_figure(nvml: FakeNvml) -> None:
    """On the CPU the sampler reports None, not 0%."""
    with GpuSampler([]) as sampler:
        pass
    assert sampler.utilisation() is None
