"""The pipeline's Python steps for one batch, timed alone: what each costs without I/O.

Run: .venv/bin/python benchmarks/hot_paths.py [--batch-size 32] [--repeats 7]
For a batch of the synthetic model's requests it times, in this process with ``timeit``
(the best of ``--repeats`` rounds, so that a busy machine moves the figures less than it moves
``pipeline_cpu.py``'s), each step the producer, the batcher and the worker take in Python:
validating and encoding the requests and their admission call, decoding the stream entries
(the batcher's read and the worker's claim), building the task message and decoding it as
the worker's Celery does, building the answers and the finalize call, the worker's metrics,
and decoding the results. Redis, the sockets and Celery's loop are not in it:
``pipeline_cpu.py`` measures the whole. It prints µs per batch and per request, by process.
"""

from __future__ import annotations

import argparse
import timeit
from collections.abc import Callable
from typing import Any
from unittest import mock

from kombu.utils.json import loads as kombu_loads

from config.batch_task import BatchTask
from config.keys import Keys
from config.schema import STREAM_FIELD
from config.settings import load_settings
from producer.admission import Prepared, ProducerCore, read_inbox
from workers.models.base import outputs_of
from workers.models.synthetic import SyntheticModel
from workers.protocol.entries import read_entries
from workers.protocol.results import ResultWriter
from workers.protocol.task_message import batch_message
from workers.runtime.answers import answers_of
from workers.runtime.batch_run import BatchRun
from workers.runtime.device import ModelRun, Runnable
from workers.runtime.metrics import WorkerMetrics

MODEL = "synthetic"
WORKER = "w0@host"  # the Celery node name answers carry


def best_us(step: Callable[[], Any], repeats: int) -> float:
    """The best time of one call of ``step`` over ``repeats`` rounds, in µs."""
    timer = timeit.Timer(step)
    calls, _ = timer.autorange()
    return min(timer.repeat(repeat=repeats, number=calls)) / calls * 1e6


def synthetic_run(runnables: list[Runnable]) -> tuple[BatchRun, ModelRun, str]:
    """A batch of ``runnables`` as its worker holds it once the synthetic model (at 0 ms) has
    run it: the batch, the model run, the model version; what ``answers_of`` takes."""
    model = SyntheticModel(base_ms=0, per_item_ms=0)
    requests = [request for _, request in runnables]
    run = ModelRun(
        runnables,
        outputs_of(model, [request.input for request in requests]),
        None,
        0.0026,
        requests[0].submitted_at + 0.01,
    )
    batch = BatchRun(MODEL, "b-1", "size", mock.Mock(), mock.Mock(), ttl_s=600, lease_s=55)
    return batch, run, model.version


def steps(size: int) -> list[tuple[str, str, Callable[[], Any]]]:
    """(process, step, the call) for a batch of ``size`` requests, in pipeline order."""
    settings = load_settings(models={MODEL: {}})
    core = ProducerCore(settings)
    inputs = [f"request {n}" for n in range(size)]

    def prepare() -> list[Prepared]:
        return core.build(core.check_all(MODEL, inputs))

    prepared = prepare()
    stream_entries = [
        (f"1764740000000-{n}".encode(), {STREAM_FIELD.encode(): item.encoded.encode()})
        for n, item in enumerate(prepared)
    ]
    pairs = [[f"1764740000000-{n}", item.request_id] for n, item in enumerate(prepared)]
    task = BatchTask(MODEL, "b-1", pairs, "size")
    message = batch_message(task, Keys(settings.key_prefix).celery_queue(MODEL))
    requests = [request for _, _, request in read_entries(stream_entries, MODEL, 600).decoded]
    batch, run, version = synthetic_run(
        [(entry_id, request) for (entry_id, _), request in zip(pairs, requests, strict=True)]
    )
    writer = ResultWriter(mock.Mock(), Keys(settings.key_prefix), MODEL)
    writer._write = lambda keys, args: ["written"] * size  # type: ignore[method-assign]
    answers = answers_of(batch, [run], version, WORKER)
    metrics = WorkerMetrics(mock.Mock(latest=None), WORKER, [MODEL])
    results = [answer.payload for answer in answers]

    def celery_decode() -> Any:
        envelope = kombu_loads(message)  # type: ignore[no-untyped-call]
        return kombu_loads(envelope["body"])  # no body_encoding: the JSON itself

    return [
        ("producer", "prepare (validate, digest, encode)", prepare),
        ("producer", "admission call (keys, args)", lambda: core.admit_call(prepared)),
        ("batcher", "decode stream entries", lambda: read_entries(stream_entries, MODEL, 600)),
        ("batcher", "task message", lambda: batch_message(task, "q")),
        ("worker", "task message decode (as Celery)", celery_decode),
        ("worker", "decode the claimed entries", lambda: read_entries(stream_entries, MODEL, 600)),
        ("worker", "answers", lambda: answers_of(batch, [run], version, WORKER)),
        ("worker", "finalize call (keys, args)", lambda: writer.finalize(answers)),
        ("worker", "metrics", lambda: metrics.observe_run(MODEL, requests, 0.0026, 0.0)),
        ("producer", "decode results", lambda: read_inbox(results)),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    print(f"batch of {args.batch_size}, synthetic model, best of {args.repeats} rounds (timeit)")
    print(f"{'process':9} {'step':36} {'µs a batch':>11} {'µs a request':>13}")
    totals: dict[str, float] = {}
    for process, step, call in steps(args.batch_size):
        us = best_us(call, args.repeats)
        totals[process] = totals.get(process, 0.0) + us
        print(f"{process:9} {step:36} {us:11.1f} {us / args.batch_size:13.2f}")
    for process, us in totals.items():
        print(f"{process:9} {'in all':36} {us:11.1f} {us / args.batch_size:13.2f}")


if __name__ == "__main__":
    main()
