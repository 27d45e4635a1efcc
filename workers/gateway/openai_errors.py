"""The fleet's refusals and failures as the HTTP answers an OpenAI client expects: a status,
OpenAI's error body (``{"error": {"message", "type", "param", "code"}}``) and, for a full queue
or an unreachable Redis, ``Retry-After``.

| fleet says | HTTP |
| --- | --- |
| bad input (``InvalidInput``, ``InputTooLarge``, ``DeadlinePassed``, ``RequestIdConflict``, ``invalid_input``) | 400 |
| ``UnknownModel`` | 404 |
| ``QueueFull`` | 429, Retry-After |
| ``expired``, or the gateway's wait ended (``ResultTimeout``) | 504 |
| Redis away (``BrokerUnavailable``) | 503, Retry-After |
| ``cancelled`` | 409 |
| ``model_error``, ``poison``, anything else | 500 |
"""  # noqa: E501

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastapi.responses import JSONResponse

from config.errors import (
    BatchfleetError,
    BrokerUnavailable,
    QueueFull,
    RequestCancelled,
    RequestExpired,
    RequestFailed,
    RequestRejected,
    ResultTimeout,
    UnknownModel,
    UnknownRequest,
)

RETRY_AFTER_S = 1
BAD_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"


@dataclass
class ApiError(Exception):
    """Raised by a route for an answer of its own (a bad field, an unknown file)."""

    status: int
    message: str
    code: str | None = None
    param: str | None = None
    type: str = BAD_REQUEST
    headers: dict[str, str] = field(default_factory=dict)

    def response(self) -> JSONResponse:
        body = {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }
        return JSONResponse(body, status_code=self.status, headers=self.headers)


class UnfitOutput(ValueError):
    """Raised when a model's output does not fit the endpoint (no vector, no text): a 500,
    or in a batch job a ``model_error`` line."""


def api_error(exc: BatchfleetError | UnfitOutput) -> ApiError:
    """The HTTP answer to what the fleet raised (the table in this module's docstring)."""
    message = str(exc)
    retry = {"Retry-After": str(RETRY_AFTER_S)}
    if isinstance(exc, UnknownModel):
        return ApiError(404, message, "model_not_found", "model")
    if isinstance(exc, QueueFull):
        return ApiError(429, message, exc.reason, type="rate_limit_error", headers=retry)
    if isinstance(exc, RequestRejected):
        return ApiError(400, message, exc.reason, "input")
    if isinstance(exc, RequestExpired):
        return ApiError(504, message, exc.code, type=SERVER_ERROR)
    if isinstance(exc, ResultTimeout):
        return ApiError(504, message, "timeout", type=SERVER_ERROR)
    if isinstance(exc, BrokerUnavailable):
        return ApiError(503, message, "broker_unavailable", type=SERVER_ERROR, headers=retry)
    if isinstance(exc, RequestCancelled):
        return ApiError(409, message, exc.code)
    if isinstance(exc, RequestFailed) and exc.code == "invalid_input":
        return ApiError(400, message, exc.code, "input")
    if isinstance(exc, UnknownRequest):
        return ApiError(404, message, "not_found")
    if isinstance(exc, UnfitOutput):
        return ApiError(500, message, "model_error", type=SERVER_ERROR)
    code = exc.code if isinstance(exc, RequestFailed) else type(exc).__name__
    return ApiError(500, message, code, type=SERVER_ERROR)


def as_api_error(exc: Exception) -> ApiError | None:
    """The HTTP answer to what a route raised: its own ``ApiError``, or the fleet's refusal
    or failure; None for anything else (a bug, answered 500)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, BatchfleetError | UnfitOutput):
        return api_error(exc)
    return None


def invalid_request(errors: Sequence[Mapping[str, Any]], fallback: str) -> ApiError:
    """The 400 for a body that failed validation: its first error (pydantic's), named by the
    field's path; ``fallback`` for a failure with no error listed."""
    first = errors[0] if errors else {}
    where = ".".join(str(part) for part in first.get("loc", ())) or None
    message = f"{where}: {first.get('msg')}" if where else str(first.get("msg", fallback))
    return ApiError(400, message, "invalid_request", where)
