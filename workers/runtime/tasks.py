"""The batch task Celery runs in a worker process, bound to that process's runtime."""

from __future__ import annotations

from typing import Any

from celery import Celery, Task

from config.batch_task import RUN_BATCH_TASK, BatchTask
from workers.runtime.runtime import WorkerRuntime


def register_tasks(app: Celery, runtime: WorkerRuntime) -> None:
    """Registers the batch task on ``app``, bound to this process's runtime."""

    @app.task(  # type: ignore[untyped-decorator]
        name=RUN_BATCH_TASK, bind=True, acks_late=True, reject_on_worker_lost=True
    )
    def run_batch(
        task: Task,
        model: str,
        batch_id: str,
        entries: list[list[str]],
        flush_reason: str | None = None,
    ) -> dict[str, Any]:
        redelivered = bool((task.request.delivery_info or {}).get("redelivered"))
        return runtime.run_batch(BatchTask(model, batch_id, entries, flush_reason), redelivered)
