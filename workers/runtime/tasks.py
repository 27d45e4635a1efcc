"""The batch task Celery runs in a worker process, bound to that process's runtime."""

from __future__ import annotations

from typing import Any

from celery import Celery, Task
from celery.worker.request import Request

from config.batch_task import RUN_BATCH_TASK, BatchTask
from workers.runtime.runtime import WorkerRuntime


class DecodedRequest(Request):  # type: ignore[misc]  # Celery has no types
    """Celery's worker request, handed to the pool with the task's body decoded.

    Celery decodes a task message's body in the worker's loop (to tell its protocol) and,
    given it undecoded, once more in the pool's thread before the task runs: the largest part
    of Celery's own work around a batch in the pool thread while a batch's body carried its
    requests' JSON (~27 µs a batch of 32, ``benchmarks/README.md``; it now names them). The
    loop's decode is kept with the message, so this one costs nothing.
    """

    def __init__(self, message: Any, *args: Any, **kwargs: Any) -> None:
        if not kwargs.get("decoded"):
            kwargs.update(body=message.payload, decoded=True)
        super().__init__(message, *args, **kwargs)


def register_tasks(app: Celery, runtime: WorkerRuntime) -> None:
    """Registers the batch task on ``app``, bound to this process's runtime."""

    @app.task(  # type: ignore[untyped-decorator]
        name=RUN_BATCH_TASK,
        bind=True,
        acks_late=True,
        reject_on_worker_lost=True,
        Request=DecodedRequest,
    )
    def run_batch(
        task: Task,
        model: str,
        batch_id: str,
        entries: list[list[str]],
        flush_reason: str | None = None,
    ) -> str:
        """Runs the batch; its result, which Flower shows, says how many requests ran (late
        joiners included) and how many the batch was sent with. It is text: Celery writes out
        a task's result for the task's succeeded event, in ~2 µs for a short text against
        ~16 µs for a dictionary of three keys (``timeit``)."""
        redelivered = bool((task.request.delivery_info or {}).get("redelivered"))
        summary = runtime.run_batch(BatchTask(model, batch_id, entries, flush_reason), redelivered)
        return f"{summary['ran']} requests ran ({summary['size']} sent)"
