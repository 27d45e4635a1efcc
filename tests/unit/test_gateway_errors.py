"""What an OpenAI client gets for each refusal and failure of the fleet: the status its SDK
maps to the right exception, OpenAI's error body, and Retry-After where a retry helps."""

from __future__ import annotations

import json

import pytest

from config.errors import (
    BatchfleetError,
    BrokerUnavailable,
    DeadlinePassed,
    InputTooLarge,
    InvalidInput,
    InvalidRequest,
    ModelError,
    PoisonInput,
    QueueFull,
    RequestCancelled,
    RequestExpired,
    RequestIdConflict,
    ResultTimeout,
    UnknownModel,
)
from workers.gateway.openai_errors import api_error


@pytest.mark.parametrize(
    ("error", "status", "code", "retry_after"),
    [
        (InvalidInput("bad"), 400, "invalid_input", False),
        (InputTooLarge("big"), 400, "too_large", False),
        (DeadlinePassed("late"), 400, "deadline_passed", False),
        (RequestIdConflict("again"), 400, "id_conflict", False),
        (InvalidRequest("r1", "bad"), 400, "invalid_input", False),
        (UnknownModel("who"), 404, "model_not_found", False),
        (QueueFull("full"), 429, "queue_full", True),
        (RequestExpired("r1", "late"), 504, "expired", False),
        (ResultTimeout("slow"), 504, "timeout", False),
        (BrokerUnavailable("away"), 503, "broker_unavailable", True),
        (RequestCancelled("r1", "stop"), 409, "cancelled", False),
        (ModelError("r1", "boom"), 500, "model_error", False),
        (PoisonInput("r1", "crash"), 500, "poison", False),
    ],
)
def test_each_refusal_gets_its_status_and_openais_error_body(
    error: BatchfleetError, status: int, code: str, retry_after: bool
) -> None:
    response = api_error(error).response()
    assert response.status_code == status
    body = json.loads(bytes(response.body))
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == code
    assert ("retry-after" in response.headers) == retry_after
