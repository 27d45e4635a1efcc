"""Cluster-ready: every Lua script batchfleet has runs here through the call site the product
uses, and each call's keys share one hash slot (``script_calls``, the suite-wide check, fails
any test whose script call spans slots)."""

from __future__ import annotations

from typing import get_args

import fakeredis
import pytest

from config.batch_task import BatchTask
from config.errors import InvalidInput
from config.keys import Keys, device_consumer
from config.lua import ScriptName
from config.settings import Settings
from producer.client import Producer
from tests.script_slots import ScriptCalls
from tests.unit.test_batch_path import RecordingCelery, new_batcher, one_batch_first_on
from workers.protocol.batch_cap import BatchCap
from workers.protocol.capacity import GpuClaim, NodeBeat, node_heartbeat
from workers.runtime.runtime import WorkerRuntime

MODEL = "synthetic"


def test_every_script_is_called_with_keys_of_one_slot(
    settings: Settings,
    fake_redis: fakeredis.FakeRedis,
    producer: Producer,
    script_calls: ScriptCalls,
) -> None:
    keys = Keys(settings.key_prefix)
    celery = RecordingCelery(fake_redis)
    batcher = new_batcher(settings, fake_redis, celery)
    runtime = WorkerRuntime(settings, "w1", "cpu", [MODEL], client=fake_redis)
    gone = device_consumer("gone", "old")
    ids, args = one_batch_first_on(gone, ["a", "b"], producer, batcher, celery, fake_redis)
    runtime.run_batch(BatchTask(*args), redelivered=True)
    assert sorted(result.request_id for result in producer.results(ids, timeout_s=5)) == sorted(ids)
    mine = producer.submit(MODEL, "c", request_id="my-own-id")
    assert producer.cancel(mine) is True
    with pytest.raises(InvalidInput):  # no worker serves the streaming lane
        next(producer.stream(MODEL, "d"))
    claim = GpuClaim(keys.gpu_claim("GPU-1"), "w1")
    node_heartbeat(fake_redis, keys, NodeBeat("w1", "w1:device", {}, [MODEL], 30, claim))
    cap = BatchCap(fake_redis, keys, MODEL, max_batch_size=8)
    cap.out_of_memory(8)
    for _ in range(100):
        cap.succeeded(cap.current())
    batcher.step()

    assert script_calls.names() == set(get_args(ScriptName))
    assert not script_calls.cross_slot()
