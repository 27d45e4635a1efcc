"""What one process writes and another reads is pinned: the batch task, the node status and a
stream's chunks. Changing one breaks a fleet whose processes run different versions."""

from __future__ import annotations

import dataclasses
import inspect

import fakeredis
from celery import Celery

from config import node_status
from config.batch_task import RUN_BATCH_TASK, BatchTask
from config.settings import Settings
from config.stream_chunks import decode_chunk, encode_chunk, error_chunk, last_chunk
from workers.runtime.gpu import GpuReading
from workers.runtime.runtime import WorkerRuntime
from workers.runtime.tasks import register_tasks
from workers.runtime.work_done import WorkDone


def test_a_batch_task_carries_positional_json_arguments() -> None:
    """The task is ``batchfleet.run_batch(model, batch_id, [[entry id, raw]…], reason)``;
    Flower sees the batch's size, never its inputs."""
    task = BatchTask("m", "b1", [("1-0", '{"x":1}'), ("1-1", '{"x":2}')], "size")
    assert RUN_BATCH_TASK == "batchfleet.run_batch"
    assert task.args() == ["m", "b1", [["1-0", '{"x":1}'], ["1-1", '{"x":2}']], "size"]
    assert task.argsrepr() == "('m', 'b1', <2 requests>, 'size')"
    assert BatchTask(*task.args()) == BatchTask("m", "b1", task.args()[2], "size")


def test_the_worker_task_takes_the_arguments_the_batcher_sends(
    fake_redis: fakeredis.FakeRedis,
) -> None:
    """The registered task's parameters are the batch task's fields, in order."""
    app = Celery(set_as_current=False)
    runtime = WorkerRuntime(Settings(), "w1", "cpu", ["synthetic"], client=fake_redis)
    register_tasks(app, runtime)
    parameters = list(inspect.signature(app.tasks[RUN_BATCH_TASK].run).parameters)
    assert parameters == [field.name for field in dataclasses.fields(BatchTask)]


def test_the_node_status_fields_are_pinned() -> None:
    """What ``batchfleet top`` reads from each worker's status hash."""
    work = WorkDone()
    work.add("m", requests=8, model_s=0.25, finished_at=1000.0)
    assert work.fields() == {
        "batches": "1",
        "requests": "8",
        "busy_s": "0.250000",
        "batches:m": "1",
        "requests:m": "8",
        "last_batch_at": "1000.000",
    }
    assert (node_status.AT, node_status.DEVICE, node_status.MODELS) == ("at", "device", "models")
    reading = GpuReading(0, "H200", 0.5, 1, 2, 60.0, 400.0, uuid="GPU-1")
    assert tuple(reading.fields()) == node_status.GPU_FIELDS
    assert all(field.startswith(node_status.GPU_PREFIX) for field in node_status.GPU_FIELDS)


def test_a_chunk_is_one_json_field_and_the_last_says_final() -> None:
    """Chunks travel as ``{"chunk": json}``; the last carries ``final`` and the whole output
    or the error."""
    fields = encode_chunk({"delta": "he"})
    assert fields == {"chunk": '{"delta": "he"}'}
    assert decode_chunk({b"chunk": fields["chunk"].encode()}) == {"delta": "he"}
    assert last_chunk({"text": "hello"}) == {"final": True, "text": "hello"}
    assert error_chunk("expired", "late") == {
        "final": True,
        "error": {"code": "expired", "message": "late"},
    }
