"""Building a batch's answers from its model runs: an output, or the error of one input."""

from __future__ import annotations

import functools
import logging
from functools import partial
from typing import Any

from config import stats_fields
from config.errors import InvalidInput
from config.schema import ErrorCode, ResultEncoder, output_json
from workers.models.base import ItemError
from workers.protocol.results import Answer, error_answer, latency_sample
from workers.runtime.batch_run import BatchRun
from workers.runtime.device import ModelRun

log = logging.getLogger(__name__)

Failure = tuple[ErrorCode, str]
"""Why an output is no answer: the error code and message its request is answered with."""


def answers_of(batch: BatchRun, runs: list[ModelRun], version: str, worker: str) -> list[Answer]:
    """One final answer per request of the model runs: its output, or an error for the
    inputs that failed alone (the model's ``ItemError`` code, else ``model_error``) and the
    outputs that cannot travel as JSON. An output's result is encoded from its parts
    (``ResultEncoder``), once."""
    answers = []
    for run in runs:
        results = ResultEncoder(
            batch.model,
            version,
            batch.batch_id,
            len(run.runnables),
            run.model_s,
            worker,
            run.finished_at,
        )
        # Made once for a run of answers submitted at one time (one admission's requests).
        sample = functools.lru_cache(maxsize=1)(partial(latency_sample, run.finished_at))
        for (entry_id, request), output in zip(run.runnables, run.outputs, strict=True):
            encoded = _encoded_output(output, run.error)
            if isinstance(encoded, tuple):
                code, message = encoded
                log.warning(
                    "batch %s: request %s failed: %s", batch.batch_id, request.request_id, message
                )
                answers.append(error_answer(request, entry_id, code, message, batch.ttl_s))
                continue
            # Positional, in the fields' order: half the time of naming them, per request.
            answers.append(
                Answer(
                    entry_id,
                    request.request_id,
                    results.encode(request, encoded, batch.flush_reason_of(entry_id)),
                    stats_fields.COMPLETED,
                    sample(request.submitted_at),
                    request.digest,
                    batch.ttl_s,
                    (version, encoded),
                )
            )
    return answers


def _encoded_output(output: Any, run_error: str | None) -> str | Failure:
    """``output`` as its result carries it (``output_json``), or why it is no answer: its
    model call failed, the model returned an ``ItemError`` in its place, or it cannot travel
    as JSON."""
    if run_error is not None:
        return "model_error", run_error
    if isinstance(output, ItemError):
        code = output.code if output.code in ("invalid_input", "model_error") else "model_error"
        return code, str(output.message)
    try:
        return output_json(output)
    except InvalidInput as exc:
        return "model_error", f"output is not JSON: {exc}"
