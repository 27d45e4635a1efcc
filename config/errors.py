"""The one exception tree batchfleet raises; catch ``BatchfleetError`` to catch them all.

::

    BatchfleetError
    ├── ConfigError               settings are invalid or inconsistent
    │   └── UnsupportedRedis      the Redis server is older than 6.2
    ├── WireFormatError           a request or result on the wire cannot be decoded
    ├── BrokerUnavailable         Redis cannot be reached
    ├── RedisAccessDenied         Redis refused the credentials or the user's permissions
    ├── RequestRejected           refused at submit; nothing was enqueued
    │   ├── UnknownModel
    │   ├── InvalidInput
    │   │   └── InputTooLarge
    │   ├── DeadlinePassed
    │   ├── QueueFull
    │   └── RequestIdConflict
    ├── RequestFailed             the request's final answer is an error (has ``code``)
    │   ├── RequestExpired        code "expired"
    │   ├── InvalidRequest        code "invalid_input"
    │   ├── ModelError            code "model_error"
    │   ├── PoisonInput           code "poison"
    │   └── RequestCancelled      code "cancelled"
    ├── ResultTimeout             no final answer within the caller's wait
    └── UnknownRequest            no such request id, or its result has expired
"""

from __future__ import annotations


class BatchfleetError(Exception):
    """Raised for every failure batchfleet reports; the root of the tree."""


class ConfigError(BatchfleetError):
    """Raised when settings are invalid or contradict each other."""


class UnsupportedRedis(ConfigError):
    """Raised when the Redis server runs a version batchfleet does not support (before 6.2)."""


class WireFormatError(BatchfleetError):
    """Raised when a request or result read from Redis or Celery cannot be decoded."""

    def __init__(self, message: str, *, raw: object = None) -> None:
        super().__init__(message)
        self.raw = raw


class BrokerUnavailable(BatchfleetError):
    """Raised when Redis cannot be reached or stops answering. From ``submit_many``,
    ``accepted_ids`` lists what earlier chunks enqueued before Redis went away."""

    def __init__(self, message: str, accepted_ids: list[str] | None = None) -> None:
        super().__init__(message)
        self.accepted_ids = accepted_ids or []


class RedisAccessDenied(BatchfleetError):
    """Raised when Redis refuses the configured credentials (a wrong password, an unknown or
    disabled user) or a command the user is not permitted: no outage, waiting won't help."""


class RequestRejected(BatchfleetError):
    """Raised when a request is refused at submit; nothing of the refused call (of its chunk,
    for a ``submit_many`` of more than 256) was enqueued. ``reason`` names the refusal in
    metrics; ``accepted_ids`` lists what a ``submit_many`` call enqueued in earlier chunks
    before the refused one: those requests will be answered."""

    reason = "rejected"

    def __init__(self, message: str, accepted_ids: list[str] | None = None) -> None:
        super().__init__(message)
        self.accepted_ids = accepted_ids or []


class UnknownModel(RequestRejected):
    """Raised when a request names a model the fleet does not serve."""

    reason = "unknown_model"


class InvalidInput(RequestRejected):
    """Raised when an input is not JSON-serialisable or otherwise malformed."""

    reason = "invalid_input"


class InputTooLarge(InvalidInput):
    """Raised when an encoded input is over the size cap."""

    reason = "too_large"


class DeadlinePassed(RequestRejected):
    """Raised when a request's deadline is already past at submit."""

    reason = "deadline_passed"


class QueueFull(RequestRejected):
    """Raised when the model's queue has no room for the requests submitted."""

    reason = "queue_full"


class RequestIdConflict(RequestRejected):
    """Raised when a request id is reused with a different model or input;
    ``conflicting_ids`` lists the ids refused for it."""

    reason = "id_conflict"

    def __init__(
        self,
        message: str,
        accepted_ids: list[str] | None = None,
        conflicting_ids: list[str] | None = None,
    ) -> None:
        super().__init__(message, accepted_ids)
        self.conflicting_ids = conflicting_ids or []


class RequestFailed(BatchfleetError):
    """Raised when a request's final answer is an error; ``code`` says which."""

    code = "failed"

    def __init__(self, request_id: str, message: str) -> None:
        super().__init__(f"request {request_id}: {message}")
        self.request_id = request_id
        self.detail = message


class RequestExpired(RequestFailed):
    """Raised when a request passed its deadline before it ran."""

    code = "expired"


class InvalidRequest(RequestFailed):
    """Raised when a queued request could not be decoded or validated by the fleet."""

    code = "invalid_input"


class ModelError(RequestFailed):
    """Raised when the model failed on a request."""

    code = "model_error"


class PoisonInput(RequestFailed):
    """Raised when the request's input killed the process running it ``max_attempts`` times;
    it was moved to the model's dead-letter stream instead of being run again."""

    code = "poison"


class RequestCancelled(RequestFailed):
    """Raised when the request was cancelled (``Producer.cancel``) before its answer."""

    code = "cancelled"


class ResultTimeout(BatchfleetError):
    """Raised when a caller's wait ends before the request's final answer; it may still come.
    ``pending_ids`` names the requests still unanswered: each stays valid to ask for again."""

    def __init__(self, message: str, pending_ids: list[str] | None = None) -> None:
        super().__init__(message)
        self.pending_ids = pending_ids or []


class UnknownRequest(BatchfleetError):
    """Raised when a request id was never accepted, or its result has outlived its TTL."""


FAILURES_BY_CODE: dict[str, type[RequestFailed]] = {
    cls.code: cls
    for cls in (RequestExpired, InvalidRequest, ModelError, PoisonInput, RequestCancelled)
}


def failure_for(code: str, request_id: str, message: str) -> RequestFailed:
    """Returns the exception for a final error result with ``code``."""
    return FAILURES_BY_CODE.get(code, RequestFailed)(request_id, message)
