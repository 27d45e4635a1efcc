"""Out of memory on the device: the batch is halved and retried, and every worker and batcher
of the model keeps batches under the size that fit, raising it again slowly."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import fakeredis

from config.keys import Keys
from config.settings import WorkerSettings
from workers.protocol.batch_cap import RAISE_AFTER, BatchCap, is_out_of_memory
from workers.runtime.gpu import GpuReading

from .test_batch_path import add_worker, answers_of_backend, fleet_of_backend, run_one_batch

KEYS = Keys("bf")


class SmallDeviceModel:
    """Runs out of memory on batches of more than 2, like a GPU too small for the batch."""

    version = "1"

    def setup(self, device: str) -> None:
        pass

    def predict(self, batch: Sequence[Any]) -> list[Any]:
        if len(batch) > 2:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return list(batch)


class TinyDeviceModel(SmallDeviceModel):
    """Holds one input at a time."""

    def predict(self, batch: Sequence[Any]) -> list[Any]:
        if len(batch) > 1:
            raise RuntimeError("CUDA out of memory")
        return list(batch)


def test_an_out_of_memory_batch_is_halved_and_the_cap_is_shared(
    fake_redis: fakeredis.FakeRedis,
) -> None:
    """A batch of 4 that runs out of memory is answered in halves, and the model's batch cap
    in Redis drops to 2 for every process."""
    answers = answers_of_backend(fake_redis, f"{__name__}:SmallDeviceModel", ["a", "b", "c", "d"])
    assert [answer.output for answer in answers] == ["a", "b", "c", "d"]
    assert {answer.batch_size for answer in answers} == {2}
    assert fake_redis.get(KEYS.batch_cap("synthetic")) == b"2"


def test_the_batcher_keeps_batches_under_the_cap(fake_redis: fakeredis.FakeRedis) -> None:
    """With a cap of 2 a batcher sends batches of 2, whatever max_batch_size says."""
    fake_redis.set(KEYS.batch_cap("synthetic"), 2)
    with fleet_of_backend(fake_redis, f"{__name__}:SmallDeviceModel") as fleet:
        fleet.producer.submit_many("synthetic", ["a", "b", "c", "d"])
        add_worker(fake_redis, slots=2)
        fleet.batcher.step()
        fleet.batcher.step()
    assert [len(args[2]) for args in (task["args"] for task in fleet.celery.sent)] == [2]


def test_the_cap_rises_by_an_eighth_after_a_run_of_successes_and_is_forgotten_at_max(
    fake_redis: fakeredis.FakeRedis,
) -> None:
    """RAISE_AFTER batches in a row at the cap raise it; back at max_batch_size it is deleted."""
    cap = BatchCap(fake_redis, KEYS, "m", max_batch_size=32)
    cap.out_of_memory(33)
    assert cap.current() == 16
    for _ in range(RAISE_AFTER):
        cap.succeeded(16)
    assert cap.current() == 18
    cap.succeeded(4)  # a small batch says nothing about the cap
    fake_redis.set(KEYS.batch_cap("m"), 30)
    cap = BatchCap(fake_redis, KEYS, "m", max_batch_size=32)
    for _ in range(RAISE_AFTER):
        cap.succeeded(30)
    assert fake_redis.get(KEYS.batch_cap("m")) is None
    assert cap.current() == 32


def test_out_of_memory_is_recognised_by_type_or_message() -> None:
    """torch's OutOfMemoryError, and CUDA or allocator messages that say so."""
    out_of_memory = type("OutOfMemoryError", (RuntimeError,), {})
    assert is_out_of_memory(out_of_memory("boom"))
    assert is_out_of_memory(RuntimeError("CUDA out of memory. Tried to allocate"))
    assert not is_out_of_memory(ValueError("bad input"))


def test_one_model_call_lowers_the_cap_once_and_one_input_never_does(
    fake_redis: fakeredis.FakeRedis,
) -> None:
    """A batch of 4 that runs out of memory halves the cap to 2 once, though its bisection runs
    out of memory again at 2; an input too big alone leaves the cap where it is."""
    answers = answers_of_backend(fake_redis, f"{__name__}:TinyDeviceModel", list("abcd"))
    assert all(answer.ok for answer in answers)
    assert fake_redis.get(KEYS.batch_cap("synthetic")) == b"2"
    cap = BatchCap(fake_redis, KEYS, "synthetic", max_batch_size=32)
    cap.out_of_memory(1)
    assert cap.current() == 2


class SizeRecordingModel(SmallDeviceModel):
    """Runs any batch and records the sizes it was given."""

    sizes: ClassVar[list[int]] = []

    def predict(self, batch: Sequence[Any]) -> list[Any]:
        self.sizes.append(len(batch))
        return list(batch)


def reading_with_free_mib(free_mib: int) -> GpuReading:
    total = 80 * 2**30
    return GpuReading(0, "H100", 0.5, total - free_mib * 2**20, total, 60.0, 300.0)


def batch_sizes_run_with_free_mib(client: fakeredis.FakeRedis, free_mib: int) -> list[int]:
    SizeRecordingModel.sizes = []
    gated = WorkerSettings(gpu_min_free_mb=256)
    with fleet_of_backend(client, f"{__name__}:SizeRecordingModel", worker=gated) as fleet:
        fleet.runtime.gpu.latest = reading_with_free_mib(free_mib)
        ids = fleet.producer.submit_many("synthetic", ["a", "b", "c", "d"])
        run_one_batch(fleet.runtime, client, fleet.batcher, fleet.celery)
        answers = list(fleet.producer.results(ids, timeout_s=5))
    assert [answer.output for answer in answers] == ["a", "b", "c", "d"]
    return SizeRecordingModel.sizes


def test_a_batch_starting_with_too_little_gpu_memory_free_runs_in_halves(
    fake_redis: fakeredis.FakeRedis,
) -> None:
    """Below worker.gpu_min_free_mb (256 MiB here) free, a batch of 4 runs as two of 2
    before the model sees it whole; the model's shared batch cap stays (the memory may be
    another process's)."""
    assert batch_sizes_run_with_free_mib(fake_redis, free_mib=100) == [2, 2]
    assert fake_redis.get(KEYS.batch_cap("synthetic")) is None


def test_a_batch_with_gpu_memory_to_spare_runs_whole(fake_redis: fakeredis.FakeRedis) -> None:
    assert batch_sizes_run_with_free_mib(fake_redis, free_mib=4096) == [4]
    assert fake_redis.get(KEYS.batch_cap("synthetic")) is None
