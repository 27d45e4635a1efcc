"""Building a batch's answers from its model runs: an output, or the error of one input."""

from __future__ import annotations

import logging
from typing import Any

from config.errors import InvalidInput
from config.schema import ErrorCode, Result, check_json
from workers.models.base import ItemError
from workers.protocol.results import Answer, error_answer
from workers.runtime.batch_run import BatchRun
from workers.runtime.device import ModelRun

log = logging.getLogger(__name__)


def answers_of(batch: BatchRun, runs: list[ModelRun], version: str, worker: str) -> list[Answer]:
    """One final answer per request of the model runs: its output, or an error for the
    inputs that failed alone (the model's ``ItemError`` code, else ``model_error``) and the
    outputs that cannot travel as JSON."""
    answers = []
    for run in runs:
        for (entry_id, request), output in zip(run.runnables, run.outputs, strict=True):
            failure = _output_error(output, run.error)
            if failure is not None:
                code, message = failure
                log.warning(
                    "batch %s: request %s failed: %s", batch.batch_id, request.request_id, message
                )
                answers.append(error_answer(request, entry_id, code, message, batch.ttl_s))
                continue
            result = Result(
                request_id=request.request_id,
                model=batch.model,
                model_version=version,
                output=output,
                batch_id=batch.batch_id,
                batch_size=len(run.runnables),
                flush_reason=batch.flush_reason_of(entry_id),
                model_s=run.model_s,
                worker=worker,
                submitted_at=request.submitted_at,
                finished_at=run.finished_at,
            )
            answers.append(Answer(entry_id, result, request.digest, batch.ttl_s))
    return answers


def _output_error(output: Any, run_error: str | None) -> tuple[ErrorCode, str] | None:
    """Why ``output`` is no answer: its model call failed, the model returned an
    ``ItemError`` in its place, or it cannot travel as JSON; None when it is fine."""
    if run_error is not None:
        return "model_error", run_error
    if isinstance(output, ItemError):
        code = output.code if output.code in ("invalid_input", "model_error") else "model_error"
        return code, str(output.message)
    try:
        check_json(output)
    except InvalidInput as exc:
        return "model_error", f"output is not JSON: {exc}"
    return None
