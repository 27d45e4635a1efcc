"""GPU telemetry and the benchmarks' utilisation sampling, against a stand-in NVML module."""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import types
from collections.abc import Iterator

import fakeredis
import pytest
from pydantic import ValidationError

from config.errors import ConfigError
from config.keys import Keys
from config.settings import Settings
from workers.cli.main import build_parser
from workers.protocol.capacity import GpuClaim, claim_gpu
from workers.runtime.gpu import GpuReading, GpuSampler, GpuTelemetry, gpu_uuids
from workers.runtime.heartbeat import EXIT_GPU_LOST, Heartbeat
from workers.runtime.process import pinned_worker_commands, worker_hostname
from workers.runtime.runtime import WorkerRuntime

KEYS = Keys("bf")


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

    NVML_TEMPERATURE_GPU = 0

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        return b"NVIDIA H200"

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return f"GPU-{handle}aaa"

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> types.SimpleNamespace:
        return types.SimpleNamespace(used=30 * 2**30, total=140 * 2**30, free=110 * 2**30)

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        return 61

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        if handle == 1:
            raise self.NVMLError("Not Supported")
        return 412_500  # milliwatts


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


def test_telemetry_reads_the_pinned_gpu_in_base_units(nvml: FakeNvml) -> None:
    """Utilisation as a fraction, memory in bytes, temperature in Celsius, power in watts."""
    reading = GpuTelemetry(0).read()
    assert reading == GpuReading(
        index=0,
        name="NVIDIA H200",
        utilisation=0.4,
        memory_used_bytes=30 * 2**30,
        memory_total_bytes=140 * 2**30,
        temperature_c=61.0,
        power_w=412.5,
        uuid="GPU-0aaa",
    )
    assert reading.memory_free_bytes == 110 * 2**30


def test_a_figure_the_gpu_does_not_report_is_left_out(nvml: FakeNvml) -> None:
    telemetry = GpuTelemetry(1)
    reading = telemetry.read()
    assert reading is not None and reading.power_w is None
    assert "gpu_power_w" not in reading.fields()
    assert reading.fields()["gpu_memory_used_bytes"] == str(30 * 2**30)
    assert telemetry.latest == reading


class AbsentNvml(FakeNvml):
    """A machine with no NVIDIA driver: NVML does not start."""

    def nvmlInit(self) -> None:
        raise self.NVMLError("Driver Not Loaded")


@pytest.mark.parametrize("index", [None, 0])
def test_without_a_gpu_or_nvml_telemetry_says_so_once_and_never_raises(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, index: int | None
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", AbsentNvml())
    telemetry = GpuTelemetry(index)
    with caplog.at_level(logging.INFO, logger="workers.runtime.gpu"):
        assert [telemetry.read() for _ in range(3)] == [None, None, None]
    assert len(caplog.records) == 1
    assert "no GPU telemetry" in caplog.records[0].getMessage()
    assert telemetry.latest is None


def test_each_worker_beat_publishes_its_status_and_marks_its_device_alive(
    nvml: FakeNvml, fake_redis: fakeredis.FakeRedis
) -> None:
    """What `batchfleet top` reads: the worker's GPU figures and work done, kept for three
    heartbeats; and its device consumer, alive as long."""
    runtime = WorkerRuntime(Settings(), "gpu0@h", "cuda", ["synthetic"], fake_redis, gpu=0)
    runtime.work.add("synthetic", requests=8, model_s=0.25, finished_at=1000.0)
    Heartbeat(runtime).beat()
    published = fake_redis.hgetall(KEYS.node("gpu0@h"))
    assert published[b"gpu_temperature_c"] == b"61.0"
    assert published[b"gpu_power_w"] == b"412.5"
    assert published[b"models"] == b"synthetic"
    assert (published[b"batches"], published[b"requests"]) == (b"1", b"8")
    assert (published[b"batches:synthetic"], published[b"requests:synthetic"]) == (b"1", b"8")
    assert float(published[b"busy_s"]) == 0.25
    assert 0 < fake_redis.pttl(KEYS.node("gpu0@h")) <= 3000
    assert fake_redis.zscore(KEYS.devices("synthetic"), runtime.device.consumer) is not None


def test_replicas_started_with_gpu_auto_take_one_gpu_each(
    nvml: FakeNvml, fake_redis: fakeredis.FakeRedis
) -> None:
    """Replicas of one container service see every GPU of the host: each claims the first
    one no live worker holds, a third finds none, and a claim no heartbeat renews frees its
    GPU for the next."""
    uuids = gpu_uuids()
    assert uuids == ["GPU-0aaa", "GPU-1aaa"]
    assert claim_gpu(fake_redis, KEYS, uuids, "replica-1", ttl_s=3).index == 0
    assert claim_gpu(fake_redis, KEYS, uuids, "replica-2", ttl_s=3).index == 1
    with pytest.raises(ConfigError, match="all 2 GPU"):
        claim_gpu(fake_redis, KEYS, uuids, "replica-3", ttl_s=3)
    fake_redis.delete(KEYS.gpu_claim("GPU-0aaa"))  # replica-1 died; its claim expired
    third = claim_gpu(fake_redis, KEYS, uuids, "replica-3", ttl_s=3)
    assert third.index == 0
    assert third.claim == GpuClaim(KEYS.gpu_claim("GPU-0aaa"), "replica-3")
    assert fake_redis.get(KEYS.gpu_claim("GPU-0aaa")) == b"replica-3"


def test_replicas_share_each_gpu_processes_per_gpu_ways_spread_over_the_gpus_first(
    nvml: FakeNvml, fake_redis: fakeredis.FakeRedis
) -> None:
    """With two processes per GPU, four replicas take both GPUs' first places before either
    GPU's second, a fifth finds none, and a second place no heartbeat renews is taken again."""
    uuids = gpu_uuids()
    places = [
        claim_gpu(fake_redis, KEYS, uuids, f"replica-{n}", ttl_s=3, per_gpu=2) for n in range(4)
    ]
    assert [(place.index, place.share) for place in places] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    assert len({place.claim.key for place in places}) == 4
    # A GPU's first place is the key a worker of one process per GPU holds.
    assert places[1].claim.key == KEYS.gpu_claim("GPU-1aaa")
    with pytest.raises(ConfigError, match=r"all 2 GPU.*2 per GPU"):
        claim_gpu(fake_redis, KEYS, uuids, "replica-5", ttl_s=3, per_gpu=2)
    fake_redis.delete(places[2].claim.key)
    again = claim_gpu(fake_redis, KEYS, uuids, "replica-5", ttl_s=3, per_gpu=2)
    assert (again.index, again.share) == (0, 1)
    assert fake_redis.get(places[2].claim.key) == b"replica-5"


def test_a_worker_beat_renews_its_gpu_claim_and_exits_if_another_took_it(
    nvml: FakeNvml, fake_redis: fakeredis.FakeRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim is renewed while this worker holds it; if Redis lost it (frozen past its
    TTL) and another replica claimed the GPU, the worker exits for a supervisor to restart it
    on a free GPU, rather than share one."""
    claim = GpuClaim(KEYS.gpu_claim("GPU-0aaa"), "host:1")
    fake_redis.set(claim.key, claim.owner, px=10)
    runtime = WorkerRuntime(Settings(), "gpu0@h", "cuda", ["synthetic"], fake_redis, 0, claim)
    heartbeat = Heartbeat(runtime)
    heartbeat.beat()
    assert fake_redis.pttl(claim.key) > 2000
    exits: list[int] = []
    monkeypatch.setattr("workers.runtime.heartbeat.os._exit", exits.append)
    fake_redis.set(claim.key, "host:2")
    heartbeat.beat()
    assert exits == [EXIT_GPU_LOST]
    assert fake_redis.get(claim.key) == b"host:2"


def test_gpu_auto_without_a_gpu_is_a_clear_error(fake_redis: fakeredis.FakeRedis) -> None:
    with pytest.raises(ConfigError, match="finds no GPU"):
        claim_gpu(fake_redis, KEYS, [], "replica-1", ttl_s=3)


def test_a_pinned_worker_is_named_after_its_gpu_and_host() -> None:
    """The node name says which GPU of which host: gpu0@host (cpu-PID@host without one)."""
    host = socket.gethostname()
    assert worker_hostname(0) == f"gpu0@{host}"
    assert worker_hostname(1, share=2) == f"gpu1-2@{host}"
    assert worker_hostname(None) == f"cpu-{os.getpid()}@{host}"


@pytest.mark.parametrize("per_gpu", [1, 3])
def test_gpus_all_starts_processes_per_gpu_pinned_processes_each_named_and_served_apart(
    per_gpu: int,
) -> None:
    """``--gpus all`` on two GPUs: ``per_gpu`` processes pinned to each, every one a command
    the CLI takes, with its own node name and metrics port (port + GPU index with one per GPU,
    as before)."""
    commands = pinned_worker_commands(["synthetic"], gpus=2, per_gpu=per_gpu, metrics_port=9100)
    parsed = [build_parser().parse_args(command[3:]) for command in commands]
    assert [args.gpu for args in parsed] == [0] * per_gpu + [1] * per_gpu
    assert all(args.model == ["synthetic"] for args in parsed)
    ports = [args.metrics_port for args in parsed]
    assert sorted(ports) == list(range(9100, 9100 + 2 * per_gpu))
    names = [args.name or worker_hostname(args.gpu) for args in parsed]
    assert len(set(names)) == len(commands)
    if per_gpu == 1:
        assert ports == [9100, 9101]
        assert names == [worker_hostname(0), worker_hostname(1)]


def test_processes_per_gpu_is_at_least_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATCHFLEET_WORKER__PROCESSES_PER_GPU", "4")
    assert Settings().worker.processes_per_gpu == 4
    monkeypatch.setenv("BATCHFLEET_WORKER__PROCESSES_PER_GPU", "0")
    with pytest.raises(ValidationError, match="processes_per_gpu"):
        Settings()
